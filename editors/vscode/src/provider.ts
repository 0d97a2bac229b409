/**
 * The `LanguageModelChatProvider` of vendor `lmbridge`: the models lmbridge lists (`lm/models`: one per agent, one per
 * model an agent offers), listed again when it says they changed; one `lm/chat` per response, with the caller's
 * `modelOptions` that name the model's options (mode, effort, …), its `lm/part` notifications reported as they
 * arrive, the cancellation token mapped to `$/cancelRequest`, and token counts from `lm/countTokens`.
 *
 * A response never ends silently: an error becomes an exception with a readable message (VS Code shows it in the
 * chat), and a turn that produced nothing, or stopped for a reason other than finishing, says so in a text part.
 */

import * as vscode from 'vscode';
import type { LmBridge, Logger } from './bridge';
import {
    fromProtocolPart, type ThinkingPartConstructor, toProtocolMessage, toProtocolToolMode, toProtocolTools,
} from './convert';
import { describeError } from './errors';

/** How long to wait for lmbridge to answer a cancelled `lm/chat` before giving the response back anyway. */
export const DEFAULT_CANCEL_GRACE_MS = 3000;

interface BridgeModel {
    id: string;
    name?: string;
    family?: string;
    version?: string;
    maxInputTokens?: number;
    maxOutputTokens?: number;
    capabilities?: { toolCalling?: boolean | number; imageInput?: boolean };
    /** The ACP agent behind the model. */
    agent?: string;
    /** What `options.modelOptions` may set. */
    options?: { id: string; name?: string; type?: string }[];
    /** The agent's slash commands. */
    commands?: { name: string; description?: string; hint?: string }[];
}

export interface ChatResult {
    stopReason: string;
    usage?: unknown;
}

export interface ProviderOptions {
    /** `vscode.LanguageModelThinkingPart` where VS Code has it (proposed API); thinking parts are dropped otherwise. */
    thinkingPart?: ThinkingPartConstructor;
    cancelGraceMs?: number;
    /** Called with a readable message when the models cannot be listed (the extension shows it once). */
    onModelsError?: (message: string) => void;
    /** Called when an `lm/chat` has ended, with its id and how (for the log and tests). */
    onTurnEnded?: (turn: TurnRecord) => void;
}

export interface TurnRecord {
    requestId: number | undefined;
    modelId: string;
    stopReason?: string;
    error?: string;
    parts: number;
    cancelledByEditor: boolean;
    /** lmbridge answered the request (false: the provider stopped waiting after a cancellation). */
    answered: boolean;
    /** The answer's usage (tokens, context fill, cost), when the agent reported any. */
    usage?: unknown;
    milliseconds: number;
}

const STOP_NOTES: Record<string, string> = {
    max_tokens: 'the agent stopped: it reached its output token limit (max_tokens)',
    max_turn_requests: 'the agent stopped: it reached its limit of model requests for one turn (max_turn_requests)',
    refusal: 'the agent refused to continue (refusal)',
};

export class LmBridgeChatProvider implements vscode.LanguageModelChatProvider {
    private readonly changed = new vscode.EventEmitter<void>();
    readonly onDidChangeLanguageModelChatInformation: vscode.Event<void> = this.changed.event;
    private thinkingPart: ThinkingPartConstructor | undefined;
    private lastModels: vscode.LanguageModelChatInformation[] = [];
    /** The last listing failed: the list shown is the last known one or the placeholder. */
    private listFailed = false;
    /** Model id → the ids of the options lmbridge says it takes. */
    private optionIds = new Map<string, Set<string>>();

    constructor(private readonly bridge: LmBridge, private readonly log: Logger, private readonly options: ProviderOptions = {}) {
        this.thinkingPart = options.thinkingPart;
    }

    /**
     * The caller's `modelOptions` that are options of this model (callers pass others, e.g. `temperature`, which an
     * agent has no use for), with string or boolean values; undefined when none.
     */
    private modelOptions(modelId: string, given: { readonly [name: string]: any } | undefined): Record<string, string | boolean> | undefined {
        const known = this.optionIds.get(modelId);
        if (!given || !known) {
            return undefined;
        }
        const chosen = Object.entries(given).filter(([id, value]) =>
            known.has(id) && (typeof value === 'string' || typeof value === 'boolean'));
        return chosen.length ? Object.fromEntries(chosen) : undefined;
    }

    /** Ask VS Code to list the models again (settings changed, daemon restarted, lmbridge's models changed). */
    refresh(): void {
        this.changed.fire();
    }

    dispose(): void {
        this.changed.dispose();
    }

    /**
     * The agents as models. When lmbridge cannot list them (it does not start: a configuration error, a wrong path),
     * the models stay listed — the last known ones, or one placeholder — so that the user can still pick one and a
     * request says in the chat what is wrong; the extension also shows the reason in a notification.
     */
    async provideLanguageModelChatInformation(_options: vscode.PrepareLanguageModelChatModelOptions,
        token: vscode.CancellationToken): Promise<vscode.LanguageModelChatInformation[]> {
        let models: BridgeModel[];
        try {
            const result = await this.bridge.request<{ models: BridgeModel[] }>('lm/models', {}, { token });
            models = Array.isArray(result?.models) ? result.models : [];
        } catch (error) {
            const message = describeError(error);
            this.log.error(`listing models failed: ${message}`);
            this.options.onModelsError?.(message);
            this.listFailed = true;
            return this.lastModels.length ? this.lastModels : [unavailableModel(message)];
        }
        if (this.listFailed) {
            this.log.info('lmbridge lists its models again');
            this.listFailed = false;
        }
        const listed = models.filter(m => m && typeof m.id === 'string');
        this.optionIds = new Map(listed.map(m => [m.id,
            new Set((Array.isArray(m.options) ? m.options : []).map(o => o?.id).filter(id => typeof id === 'string'))]));
        this.lastModels = listed.map(m => ({
            id: m.id,
            name: m.name || m.id,
            family: m.family || 'acp',
            version: m.version || '0',
            maxInputTokens: numberOr(m.maxInputTokens, 200000),
            maxOutputTokens: numberOr(m.maxOutputTokens, 32000),
            tooltip: tooltip(m),
            detail: 'ACP agent',
            capabilities: {
                toolCalling: m.capabilities?.toolCalling ?? true,
                imageInput: m.capabilities?.imageInput ?? false,
            },
        }));
        return this.lastModels;
    }

    async provideLanguageModelChatResponse(model: vscode.LanguageModelChatInformation,
        messages: readonly vscode.LanguageModelChatRequestMessage[], options: vscode.ProvideLanguageModelChatResponseOptions,
        progress: vscode.Progress<vscode.LanguageModelResponsePart>, token: vscode.CancellationToken): Promise<void> {
        const started = Date.now();
        const record: TurnRecord = {
            requestId: undefined, modelId: model.id, parts: 0, cancelledByEditor: false, answered: false, milliseconds: 0,
        };
        const ended = () => {
            record.milliseconds = Date.now() - started;
            record.cancelledByEditor = token.isCancellationRequested;
            this.log.info(`lm/chat #${record.requestId ?? '-'} (${model.id}) ended: ` +
                (record.error ? `error: ${record.error.split('\n')[0]}` : `stopReason=${record.stopReason ?? '(not answered)'}`) +
                ` parts=${record.parts} ${record.milliseconds}ms${record.cancelledByEditor ? ' cancelled by the editor' : ''}` +
                usageText(record.usage));
            this.options.onTurnEnded?.(record);
        };
        if (token.isCancellationRequested) {
            ended();
            return;
        }
        if (model.id === UNAVAILABLE_MODEL_ID) {
            record.error = await this.unavailableReason();
            ended();
            throw new Error(record.error);
        }
        const chosen = this.modelOptions(model.id, options.modelOptions);
        const params = {
            modelId: model.id,
            messages: messages.map(toProtocolMessage),
            options: {
                tools: toProtocolTools(options.tools), toolMode: toProtocolToolMode(options.toolMode),
                ...(chosen ? { modelOptions: chosen } : {}),
            },
        };
        const report = (part: vscode.LanguageModelResponsePart | object) => {
            try {
                progress.report(part as vscode.LanguageModelResponsePart);
                record.parts++;
            } catch (error) {
                if (this.thinkingPart && part instanceof this.thinkingPart) {
                    this.log.warn(`VS Code refused a thinking part (${(error as Error).message}); thoughts are dropped from now on`);
                    this.thinkingPart = undefined;
                } else {
                    this.log.error(`reporting a response part failed: ${(error as Error).message}`);
                }
            }
        };
        const onNotification = (method: string, notification: any) => {
            if (method !== 'lm/part' || token.isCancellationRequested) {
                return;
            }
            const part = fromProtocolPart(notification?.part, this.thinkingPart);
            if (part) {
                report(part);
            }
        };
        let result: ChatResult | undefined;
        try {
            const request = this.bridge.request<ChatResult>('lm/chat', params, {
                token, onNotification, onSent: id => { record.requestId = id; },
            });
            result = await this.withCancelGrace(request, token, record);
        } catch (error) {
            record.error = describeError(error);
            ended();
            if (token.isCancellationRequested) {
                return; // the user stopped the response; what happened after that does not matter to them
            }
            throw new Error(record.error);
        }
        record.stopReason = result?.stopReason;
        record.usage = result?.usage;
        ended();
        if (this.listFailed) {
            this.refresh(); // lmbridge works again: let VS Code list the real models
        }
        if (token.isCancellationRequested || !result) {
            return;
        }
        const stopReason = result.stopReason;
        if (stopReason === 'cancelled') {
            const why = 'lmbridge cancelled this response (a newer request for the same conversation, or lmbridge was shutting down)';
            if (record.parts === 0) {
                throw new Error(why);
            }
            report(new vscode.LanguageModelTextPart(`\n\n_(${why})_`));
        } else if (STOP_NOTES[stopReason]) {
            report(new vscode.LanguageModelTextPart(`${record.parts ? '\n\n' : ''}_(${STOP_NOTES[stopReason]})_`));
        } else if (record.parts === 0) {
            report(new vscode.LanguageModelTextPart(`_(the agent ended its turn without a message; stopReason: ${stopReason})_`));
        }
    }

    /** Why lmbridge cannot serve, asked again (it may work now). */
    private async unavailableReason(): Promise<string> {
        try {
            await this.bridge.ready();
        } catch (error) {
            return describeError(error);
        }
        this.refresh();
        return 'lmbridge works again: choose one of its agents in the model picker.';
    }

    async provideTokenCount(model: vscode.LanguageModelChatInformation, text: string | vscode.LanguageModelChatRequestMessage,
        token: vscode.CancellationToken): Promise<number> {
        const params = typeof text === 'string'
            ? { modelId: model.id, text }
            : { modelId: model.id, message: toProtocolMessage(text) };
        try {
            const result = await this.bridge.request<{ count: number }>('lm/countTokens', params, { token });
            if (typeof result?.count === 'number') {
                return result.count;
            }
            this.log.warn(`lm/countTokens answered without a count: ${JSON.stringify(result)}`);
        } catch (error) {
            if (token.isCancellationRequested) {
                return 0;
            }
            this.log.warn(`lm/countTokens failed, using a local estimate: ${describeError(error)}`);
        }
        return estimateTokens(typeof text === 'string' ? text : JSON.stringify(params.message));
    }

    /**
     * The request's result; once the token is cancelled, at most `cancelGraceMs` more (lmbridge answers a cancelled
     * `lm/chat` promptly with `cancelled`; this only guards against a daemon that does not).
     */
    private withCancelGrace(request: Promise<ChatResult>, token: vscode.CancellationToken, record: TurnRecord): Promise<ChatResult | undefined> {
        const grace = this.options.cancelGraceMs ?? DEFAULT_CANCEL_GRACE_MS;
        return new Promise<ChatResult | undefined>((resolve, reject) => {
            let timer: NodeJS.Timeout | undefined;
            const subscription = token.onCancellationRequested(() => {
                timer ??= setTimeout(() => {
                    this.log.warn(`lm/chat #${record.requestId} was cancelled but lmbridge did not answer within ${grace} ms`);
                    resolve(undefined);
                }, grace);
            });
            request.then(value => {
                record.answered = true;
                resolve(value);
            }, error => {
                record.answered = true;
                reject(error);
            }).finally(() => {
                subscription.dispose();
                clearTimeout(timer);
            });
        });
    }
}

/** The id of the placeholder model shown while lmbridge cannot list its agents. */
export const UNAVAILABLE_MODEL_ID = 'lmbridge-unavailable';

function unavailableModel(reason: string): vscode.LanguageModelChatInformation {
    return {
        id: UNAVAILABLE_MODEL_ID,
        name: 'lmbridge (not available)',
        family: 'acp',
        version: '0',
        maxInputTokens: 200000,
        maxOutputTokens: 32000,
        tooltip: reason,
        detail: 'lmbridge could not list its agents: send a message to see why',
        capabilities: { toolCalling: true, imageInput: false },
    };
}

function numberOr(value: unknown, fallback: number): number {
    return typeof value === 'number' && Number.isFinite(value) && value > 0 ? value : fallback;
}

/** lmbridge's own estimate (docs/protocol.md, lm/countTokens), for when it cannot be asked. */
export function estimateTokens(text: string): number {
    let ascii = 0;
    let other = 0;
    for (const ch of text) {
        if (ch.charCodeAt(0) < 128) {
            ascii++;
        } else {
            other++;
        }
    }
    return Math.ceil(ascii / 4) + other;
}

/** What hovering a model shows: the agent, and its slash commands when it has some. */
function tooltip(model: BridgeModel): string {
    const agent = model.agent || model.id;
    const commands = (Array.isArray(model.commands) ? model.commands : []).map(c => c?.name).filter(n => typeof n === 'string');
    return `ACP agent '${agent}' through lmbridge` + (commands.length ? `; commands: ${commands.map(n => `/${n}`).join(' ')}` : '');
}

/** The usage of a turn for the log: " context 19,000 of 200,000 (10%) · 0.05 USD", or "" when there is none. */
export function usageText(usage: unknown): string {
    const u = (usage && typeof usage === 'object' ? usage : {}) as Record<string, any>;
    const pieces: string[] = [];
    if (typeof u.inputTokens === 'number' || typeof u.outputTokens === 'number') {
        pieces.push(`${u.inputTokens ?? 0} in / ${u.outputTokens ?? 0} out`);
    }
    if (typeof u.contextUsed === 'number' && typeof u.contextSize === 'number' && u.contextSize > 0) {
        const percent = Math.round(100 * u.contextUsed / u.contextSize);
        pieces.push(`context ${u.contextUsed.toLocaleString('en-US')} of ${u.contextSize.toLocaleString('en-US')} (${percent}%)`);
    }
    if (u.cost && typeof u.cost.amount === 'number' && typeof u.cost.currency === 'string') {
        pieces.push(`${u.cost.amount} ${u.cost.currency}`);
    }
    return pieces.length ? ` · ${pieces.join(' · ')}` : '';
}
