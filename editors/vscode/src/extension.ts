/**
 * Extension entry point: registers the `lmbridge` language model chat provider, the `acp_agent_action` permission
 * tool and the commands (restart, show log, add an agent from the ACP registry), reads the `lmbridge.*` settings,
 * and owns the lmbridge daemon's lifetime (restarted with new settings, stopped on deactivation).
 */

import * as vscode from 'vscode';
import { ADD_AGENT_COMMAND, addAgent } from './addAgent';
import { type BridgeSettings, type InitializeResult, LmBridge, type Logger } from './bridge';
import type { ThinkingPartConstructor } from './convert';
import { readSharingSettings, SharedModels } from './editorModels';
import { LmBridgeChatProvider, type ProviderOptions } from './provider';
import { PERMISSION_TOOL_NAME, PermissionTool } from './permissionTool';

export const VENDOR = 'lmbridge';

export interface LmBridgeExtensionApi {
    bridge: LmBridge;
    provider: LmBridgeChatProvider;
    permissionTool: PermissionTool;
}

let active: LmBridgeExtensionApi | undefined;

export function readSettings(): BridgeSettings {
    const config = vscode.workspace.getConfiguration('lmbridge');
    return {
        path: config.get<string>('path', '') ?? '',
        configFile: config.get<string>('configFile', '') ?? '',
        logLevel: config.get<string>('logLevel', 'info') ?? 'info',
        traceDir: config.get<string>('traceDir', '') ?? '',
        http: config.get<string>('http', '') ?? '',
    };
}

export function workspaceFolderPaths(): string[] {
    return (vscode.workspace.workspaceFolders ?? [])
        .filter(folder => folder.uri.scheme === 'file')
        .map(folder => folder.uri.fsPath);
}

/** `vscode.LanguageModelThinkingPart` where this VS Code has it (proposed API `languageModelThinkingPart`). */
export function thinkingPartConstructor(): ThinkingPartConstructor | undefined {
    try {
        const ctor = (vscode as unknown as Record<string, unknown>).LanguageModelThinkingPart;
        return typeof ctor === 'function' ? ctor as ThinkingPartConstructor : undefined;
    } catch {
        return undefined;
    }
}

/** How many lines of a long error a notification shows (all of it is in the log and in the chat). */
const NOTIFICATION_LINES = 6;

/**
 * An error as one notification: VS Code shows a notification's text as one paragraph, so its lines are joined;
 * a long one keeps its first line and its last lines, where a process's stderr says why it stopped.
 */
export function notificationText(message: string): string {
    const lines = message.split(/\r?\n/).map(line => line.trim()).filter(Boolean);
    if (lines.length > NOTIFICATION_LINES) {
        lines.splice(1, lines.length - NOTIFICATION_LINES, '…');
    }
    return lines.join(' ');
}

/**
 * The output channel, made safe to log to at any time: on shutdown VS Code disposes it right after calling
 * `deactivate()`, without waiting for it, and a closed channel throws. Logging must never stop a shutdown.
 */
export function safeLog(channel: vscode.LogOutputChannel): Logger {
    const guarded = (write: (message: string) => void) => (message: string) => {
        try {
            write.call(channel, message);
        } catch {
            // the channel is closed: VS Code is shutting the extension down
        }
    };
    return {
        trace: guarded(channel.trace), debug: guarded(channel.debug), info: guarded(channel.info),
        warn: guarded(channel.warn), error: guarded(channel.error),
    };
}

export function activate(context: vscode.ExtensionContext, providerOptions: ProviderOptions = {}): LmBridgeExtensionApi {
    const channel = vscode.window.createOutputChannel('lmbridge', { log: true });
    const log = safeLog(channel);
    const version = String(context.extension?.packageJSON?.version ?? '0.0.0');
    const thinkingPart = providerOptions.thinkingPart ?? thinkingPartConstructor();
    const checkPermissionTool = (result: InitializeResult) => {
        const announced = result.permissionTool?.name;
        if (announced && announced !== PERMISSION_TOOL_NAME) {
            log.warn(`lmbridge's permission tool is named '${announced}' ([permissions].tool_name), but this extension ` +
                `provides '${PERMISSION_TOOL_NAME}': agents' permission requests will not reach you. Remove tool_name from the config.`);
        }
    };
    const shared = new SharedModels(VENDOR, readSharingSettings, log);
    const bridge = new LmBridge({
        settings: readSettings,
        workspaceFolders: workspaceFolderPaths,
        log,
        clientInfo: { name: 'vscode-lmbridge', version },
        thinking: thinkingPart !== undefined,
        onInitialized: checkPermissionTool,
        onModelsChanged: () => provider.refresh(),
        editorModels: () => shared.list(),
        answerEditorChat: (params, sendPart, signal) => shared.answer(params, sendPart, signal),
    });

    const shown = new Set<string>();
    const showOnce = (message: string) => {
        if (shown.has(message)) {
            return;
        }
        shown.add(message);
        void vscode.window.showErrorMessage(notificationText(message), 'Show log', 'Open settings').then(choice => {
            if (choice === 'Show log') {
                channel.show();
            } else if (choice === 'Open settings') {
                void vscode.commands.executeCommand('workbench.action.openSettings', 'lmbridge');
            }
        });
    };

    const provider = new LmBridgeChatProvider(bridge, log, { onModelsError: showOnce, ...providerOptions, thinkingPart });
    const permissionTool = new PermissionTool();

    context.subscriptions.push(
        channel,
        provider,
        vscode.lm.registerLanguageModelChatProvider(VENDOR, provider),
        vscode.lm.registerTool(PERMISSION_TOOL_NAME, permissionTool),
        vscode.workspace.onDidChangeConfiguration(event => {
            if (event.affectsConfiguration('lmbridge')) {
                log.info('lmbridge settings changed: the next request starts lmbridge again');
                shown.clear();
                bridge.invalidate();
                provider.refresh();
            }
        }),
        vscode.workspace.onDidChangeWorkspaceFolders(() => {
            bridge.invalidate();
        }),
        vscode.lm.onDidChangeChatModels(async () => {
            try {
                const models = await shared.list();
                if (models) {
                    bridge.shareModels(models);
                }
            } catch (error) {
                log.warn(`could not list the editor's models to share: ${(error as Error)?.message ?? error}`);
            }
        }),
        vscode.commands.registerCommand('lmbridge.restart', async () => {
            shown.clear();
            await bridge.restart();
            provider.refresh();
            try {
                await bridge.ready();
                void vscode.window.showInformationMessage(`lmbridge restarted (pid ${bridge.pid}).`);
            } catch {
                // ready() failed: the log says why, and listing the models will show it
            }
        }),
        vscode.commands.registerCommand('lmbridge.showLog', () => channel.show()),
        vscode.commands.registerCommand(ADD_AGENT_COMMAND, (id?: unknown) => addAgent({
            settings: readSettings,
            restart: async () => {
                shown.clear();
                await bridge.restart();
                provider.refresh();
            },
        }, id)),
        { dispose: () => void bridge.dispose() },
    );
    active = { bridge, provider, permissionTool };
    return active;
}

export async function deactivate(): Promise<void> {
    const current = active;
    active = undefined;
    await current?.bridge.dispose();
}
