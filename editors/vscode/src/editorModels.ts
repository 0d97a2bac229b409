/**
 * The editor's own models, shared with lmbridge (docs/editor-models.md): which of `vscode.lm`'s chat models this
 * window shares (`initialize.editorModels`, `editor/modelsChanged`), and answering lmbridge's `editor/chat` with
 * `model.sendRequest`, its response parts streamed back as `editor/part`.
 *
 * Never shared: lmbridge's own models (vendor `lmbridge`: an agent asking itself would loop). Settings:
 * `lmbridge.shareEditorModels` (on by default) and `lmbridge.sharedModelFilter` (vendors or families to share;
 * empty: all). VS Code's own consent prompt — the first use of another extension's model — is the user's control:
 * a refusal is answered as an error saying so, never a hang.
 */

import * as vscode from 'vscode';
import type { Logger } from './bridge';
import { RpcError } from './rpc';

/** JSON-RPC error code for a model's own failure, as lmbridge passes it on (-32000: implementation-defined). */
const MODEL_ERROR = -32000;

export interface SharingSettings {
    share: boolean;
    /** Vendors or families to share (`copilot`, `gpt-4o`, `copilot/gpt-4o`); empty: every model. */
    filter: string[];
}

export function readSharingSettings(): SharingSettings {
    const config = vscode.workspace.getConfiguration('lmbridge');
    return {
        share: config.get<boolean>('shareEditorModels', true) ?? true,
        filter: (config.get<string[]>('sharedModelFilter', []) ?? []).map(entry => entry.trim()).filter(Boolean),
    };
}

/** The models this window shares, and which `vscode.lm` model each shared id stands for. */
export class SharedModels {
    private byId = new Map<string, vscode.LanguageModelChat>();

    constructor(private readonly ownVendor: string, private readonly settings: () => SharingSettings, private readonly log: Logger) { }

    private listings = 0;

    /** The entries to send lmbridge (`editor/modelsChanged`). Listings can overlap (a start, and a change of VS
     * Code's models): one that a later listing overtook gives undefined — send nothing, the later one sends. */
    async list(): Promise<object[] | undefined> {
        const { share, filter } = this.settings();
        const listing = ++this.listings;
        const byId = new Map<string, vscode.LanguageModelChat>();
        if (share) {
            const models = await vscode.lm.selectChatModels();
            if (listing !== this.listings) {
                return undefined;
            }
            for (const model of models) {
                if (model.vendor === this.ownVendor || !wanted(model, filter)) {
                    continue;
                }
                // Model ids are the vendor's own: two vendors may use one. The second gets its vendor in front.
                const id = byId.has(model.id) ? `${model.vendor}/${model.id}` : model.id;
                byId.set(id, model);
            }
        }
        this.byId = byId;
        return [...byId.entries()].map(([id, model]) => describe(id, model));
    }

    /** Answer one `editor/chat`. */
    async answer(params: any, sendPart: (part: object) => void, signal: AbortSignal): Promise<object> {
        const started = Date.now();
        let first: number | undefined;
        const model = this.byId.get(params?.modelId);
        if (!model) {
            throw new RpcError(-32602, `this editor shares no model ${JSON.stringify(params?.modelId)}; ` +
                `it shares: ${[...this.byId.keys()].join(', ') || 'none'}`, { field: 'modelId' });
        }
        const source = new vscode.CancellationTokenSource();
        const abort = () => source.cancel();
        signal.addEventListener('abort', abort);
        let outcome = 'answered';
        let calls = 0;
        try {
            const asked = params?.options ?? {};
            const options: vscode.LanguageModelChatRequestOptions = {
                justification: typeof asked.justification === 'string' && asked.justification
                    ? asked.justification : 'An agent in lmbridge asks this model (lmbridge: editor models).',
            };
            // vscode.lm has no portable limit on the answer's length: passed as a model option, which a provider
            // may honour or ignore.
            if (Number.isInteger(asked.maxTokens) && asked.maxTokens > 0) {
                options.modelOptions = { maxTokens: asked.maxTokens };
            }
            const tools = params?.options?.tools;
            if (Array.isArray(tools) && tools.length) {
                options.tools = tools.map((tool: any) => ({ name: tool.name, description: tool.description ?? '', inputSchema: tool.inputSchema }));
                options.toolMode = params.options.toolMode === 'required'
                    ? vscode.LanguageModelChatToolMode.Required : vscode.LanguageModelChatToolMode.Auto;
            }
            const response = await model.sendRequest(toVscodeMessages(params?.messages ?? []), options, source.token);
            for await (const part of response.stream) {
                first ??= Date.now();
                const converted = fromVscodePart(part);
                if (converted) {
                    calls += converted.type === 'tool_call' ? 1 : 0;
                    sendPart(converted);
                }
            }
            if (signal.aborted) {
                outcome = 'cancelled';
                return { stopReason: 'cancelled' };
            }
            return { stopReason: calls ? 'tool_calls' : 'end_turn' };
        } catch (error) {
            if (signal.aborted) {
                outcome = 'cancelled';
                return { stopReason: 'cancelled' };
            }
            outcome = 'failed';
            throw modelError(model, error);
        } finally {
            signal.removeEventListener('abort', abort);
            source.dispose();
            this.log.info(`editor model ${model.vendor}/${model.id}: ${outcome} in ${Date.now() - started} ms` +
                (first !== undefined ? `, first part after ${first - started} ms` : ''));
        }
    }
}

function wanted(model: vscode.LanguageModelChat, filter: string[]): boolean {
    return !filter.length || filter.some(entry =>
        entry === model.vendor || entry === model.family || entry === `${model.vendor}/${model.family}` || entry === model.id);
}

function describe(id: string, model: vscode.LanguageModelChat): object {
    // VS Code's public API does not say whether a model calls tools or sees images: where the object says (its
    // `capabilities`, as VS Code builds it), that is shared; otherwise tool calling is assumed (chat models do).
    const capabilities = (model as unknown as { capabilities?: { supportsToolCalling?: boolean; supportsImageToText?: boolean } }).capabilities;
    return {
        id,
        name: model.name,
        vendor: model.vendor,
        family: model.family,
        version: model.version,
        maxInputTokens: model.maxInputTokens > 0 ? model.maxInputTokens : undefined,
        capabilities: {
            toolCalling: capabilities?.supportsToolCalling ?? true,
            imageInput: capabilities?.supportsImageToText ?? false,
        },
    };
}

/** Editor protocol messages (lmbridge already put any system prompt first, as a user message) as `vscode.lm`'s. */
export function toVscodeMessages(messages: any[]): vscode.LanguageModelChatMessage[] {
    const out: vscode.LanguageModelChatMessage[] = [];
    for (const message of messages) {
        const parts: Array<vscode.LanguageModelTextPart | vscode.LanguageModelToolCallPart | vscode.LanguageModelToolResultPart | vscode.LanguageModelDataPart> = [];
        for (const part of Array.isArray(message?.content) ? message.content : []) {
            switch (part?.type) {
                case 'text':
                    parts.push(new vscode.LanguageModelTextPart(String(part.value ?? '')));
                    break;
                case 'tool_call':
                    parts.push(new vscode.LanguageModelToolCallPart(String(part.callId), String(part.name), toInput(part.input)));
                    break;
                case 'tool_result':
                    parts.push(new vscode.LanguageModelToolResultPart(String(part.callId), (part.content ?? []).map(resultItem)));
                    break;
                case 'data':
                    parts.push(new vscode.LanguageModelDataPart(Buffer.from(String(part.data ?? ''), 'base64'), String(part.mimeType)));
                    break;
                default:
                    break; // thinking, and parts of later protocol versions: not for the model
            }
        }
        out.push(message?.role === 'assistant'
            ? vscode.LanguageModelChatMessage.Assistant(parts as Array<vscode.LanguageModelTextPart | vscode.LanguageModelToolCallPart>)
            : vscode.LanguageModelChatMessage.User(parts as Array<vscode.LanguageModelTextPart | vscode.LanguageModelToolResultPart>));
    }
    return out;
}

function resultItem(item: any): vscode.LanguageModelTextPart | vscode.LanguageModelDataPart {
    if (item?.type === 'data') {
        return new vscode.LanguageModelDataPart(Buffer.from(String(item.data ?? ''), 'base64'), String(item.mimeType));
    }
    return new vscode.LanguageModelTextPart(String(item?.value ?? ''));
}

function toInput(input: unknown): object {
    return input !== null && typeof input === 'object' ? input as object : { value: input };
}

/** A response part of `vscode.lm` as an `editor/part`, or undefined for one lmbridge does not take. */
export function fromVscodePart(part: unknown): { type: string;[key: string]: unknown } | undefined {
    if (part instanceof vscode.LanguageModelTextPart) {
        return { type: 'text', value: part.value };
    }
    if (part instanceof vscode.LanguageModelToolCallPart) {
        return { type: 'tool_call', callId: part.callId, name: part.name, input: part.input ?? {} };
    }
    const p = part as Record<string, unknown> | null;
    if (p && typeof p === 'object' && p.constructor?.name === 'LanguageModelThinkingPart') {
        const value = Array.isArray(p.value) ? p.value.join('') : p.value;
        return typeof value === 'string' ? { type: 'thinking', value } : undefined;
    }
    if (p && typeof p === 'object' && typeof p.callId === 'string' && typeof p.name === 'string') {
        return { type: 'tool_call', callId: p.callId, name: p.name, input: p.input ?? {} };
    }
    if (p && typeof p === 'object' && typeof p.value === 'string') {
        return { type: 'text', value: p.value };
    }
    return undefined;
}

/** The model's error as lmbridge passes it on: what happened (consent refused, blocked, not found, its own). */
function modelError(model: vscode.LanguageModelChat, error: unknown): RpcError {
    const code = (error as { code?: unknown })?.code;
    const message = (error as Error)?.message ?? String(error);
    const reason = code === vscode.LanguageModelError.NoPermissions().code
        ? `the user did not allow lmbridge to use ${model.name} (VS Code's consent): ${message}`
        : code === vscode.LanguageModelError.Blocked().code
            ? `${model.name} refused the request (blocked, e.g. a quota): ${message}`
            : code === vscode.LanguageModelError.NotFound().code
                ? `${model.name} is no longer available: ${message}`
                : `${model.name} failed: ${message}`;
    return new RpcError(MODEL_ERROR, reason, { vendor: model.vendor, model: model.id, code: typeof code === 'string' ? code : undefined });
}
