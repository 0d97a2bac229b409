/**
 * Test helpers: the lmbridge to run (`LMBRIDGE_BIN`, default the repository's `.venv/bin/lmbridge`), an activated
 * extension against the fake `vscode`, and a progress collector that tests can wait on (events, not sleeps).
 */

import './register';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as vscode from 'vscode';
import { activate, deactivate, type LmBridgeExtensionApi } from '../src/extension';
import type { ThinkingPartConstructor } from '../src/convert';
import type { LmBridgeChatProvider, TurnRecord } from '../src/provider';
import type { PermissionTool } from '../src/permissionTool';
import { fake } from './fake-vscode';

/** editors/vscode */
export const PACKAGE_ROOT = path.resolve(__dirname, '..', '..');

export const LMBRIDGE_BIN = process.env.LMBRIDGE_BIN
    ? path.resolve(process.env.LMBRIDGE_BIN)
    : path.resolve(PACKAGE_ROOT, '..', '..', '.venv', 'bin', 'lmbridge');

/** Fails with a clear message when there is no lmbridge to run. */
export function requireLmbridge(): void {
    if (!fs.existsSync(LMBRIDGE_BIN)) {
        throw new Error(`lmbridge not found at ${LMBRIDGE_BIN}: run 'make test' (or 'make demo') at the repository root ` +
            'first to create .venv, or set LMBRIDGE_BIN to an lmbridge program');
    }
}

// Every directory the tests make is removed when the test process exits (each test file runs in its own).
const madeDirs: string[] = [];
process.on('exit', () => {
    for (const dir of madeDirs) {
        fs.rmSync(dir, { recursive: true, force: true });
    }
});

// lmbridge must not pick up the configuration of whoever runs the tests (nor the registry list they fetched), nor
// remember anything in their state.
const isolatedConfigHome = fs.mkdtempSync(path.join(os.tmpdir(), 'lmbridge-vscode-test-xdg-'));
madeDirs.push(isolatedConfigHome);
process.env.XDG_CONFIG_HOME = isolatedConfigHome;
process.env.XDG_STATE_HOME = path.join(isolatedConfigHome, 'state');
process.env.XDG_CACHE_HOME = path.join(isolatedConfigHome, 'cache');
delete process.env.LMBRIDGE_CONFIG;
delete process.env.LMBRIDGE_LOG_LEVEL;

export function tempDir(prefix: string): string {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), `lmbridge-vscode-${prefix}-`));
    madeDirs.push(dir);
    return dir;
}

export interface Harness {
    api: LmBridgeExtensionApi;
    provider: LmBridgeChatProvider;
    tool: PermissionTool;
    turns: TurnRecord[];
    context: { subscriptions: { dispose(): unknown }[] };
    /** Resolves with the next turn record (an `lm/chat` that ended). */
    nextTurn(): Promise<TurnRecord>;
    stop(): Promise<void>;
}

/** Activate the extension with these settings (`path` defaults to LMBRIDGE_BIN) and a workspace folder. */
export function startExtension(settings: Record<string, unknown> = {},
    options: { cancelGraceMs?: number; thinkingPart?: ThinkingPartConstructor } = {}): Harness {
    fake.reset();
    fake.workspaceFolders = [tempDir('workspace')];
    fake.settings.set('path', LMBRIDGE_BIN);
    for (const [key, value] of Object.entries(settings)) {
        fake.settings.set(key, value);
    }
    const turns: TurnRecord[] = [];
    const waiters: ((turn: TurnRecord) => void)[] = [];
    const context = { subscriptions: [] as { dispose(): unknown }[], extension: { packageJSON: { version: '0.1.0-test' } } };
    const api = activate(context as unknown as vscode.ExtensionContext, {
        // Large, so that a prompt end of a cancelled turn can only come from lmbridge answering.
        cancelGraceMs: options.cancelGraceMs ?? 60000,
        thinkingPart: options.thinkingPart,
        onTurnEnded: turn => {
            turns.push(turn);
            waiters.shift()?.(turn);
        },
    });
    const provider = fake.providers.get('lmbridge') as LmBridgeChatProvider;
    const tool = fake.tools.get('acp_agent_action') as PermissionTool;
    if (!provider || !tool) {
        throw new Error('activate() did not register the provider and the permission tool');
    }
    return {
        api, provider, tool, turns, context,
        nextTurn: () => new Promise(resolve => waiters.push(resolve)),
        async stop() {
            for (const subscription of context.subscriptions) {
                subscription.dispose();
            }
            await deactivate();
        },
    };
}

/** A `Progress` that records parts and lets a test wait for the n-th one. */
export class Collector {
    readonly parts: unknown[] = [];
    private waiters: { count: number; resolve(): void }[] = [];

    report(part: unknown): void {
        this.parts.push(part);
        this.waiters = this.waiters.filter(waiter => {
            if (this.parts.length >= waiter.count) {
                waiter.resolve();
                return false;
            }
            return true;
        });
    }

    /** Resolves once `count` parts have been reported. */
    waitForParts(count: number): Promise<void> {
        if (this.parts.length >= count) {
            return Promise.resolve();
        }
        return new Promise(resolve => this.waiters.push({ count, resolve }));
    }

    text(): string {
        return this.parts
            .filter((p): p is vscode.LanguageModelTextPart => p instanceof vscode.LanguageModelTextPart)
            .map(p => p.value)
            .join('');
    }

    toolCalls(): vscode.LanguageModelToolCallPart[] {
        return this.parts.filter((p): p is vscode.LanguageModelToolCallPart => p instanceof vscode.LanguageModelToolCallPart);
    }

    /** The parts as VS Code puts them back into the history: an assistant message. */
    asAssistantMessage(): vscode.LanguageModelChatMessage {
        return vscode.LanguageModelChatMessage.Assistant(this.parts as (vscode.LanguageModelTextPart | vscode.LanguageModelToolCallPart)[]);
    }
}

export const demoModel = {
    id: 'demo', name: 'lmbridge demo agent', family: 'acp', version: '0.1.0', maxInputTokens: 200000, maxOutputTokens: 32000,
    capabilities: { toolCalling: true, imageInput: true },
} as vscode.LanguageModelChatInformation;

export function chatOptions(tools: vscode.LanguageModelChatTool[] = []): vscode.ProvideLanguageModelChatResponseOptions {
    return { tools, toolMode: vscode.LanguageModelChatToolMode.Auto } as vscode.ProvideLanguageModelChatResponseOptions;
}

/** The permission tool as VS Code offers it to a model: from the `languageModelTools` contribution. */
export function permissionToolForModel(): vscode.LanguageModelChatTool {
    const manifest = JSON.parse(fs.readFileSync(path.join(PACKAGE_ROOT, 'package.json'), 'utf8'));
    const contribution = manifest.contributes.languageModelTools.find((t: { name: string }) => t.name === 'acp_agent_action');
    return { name: contribution.name, description: contribution.modelDescription, inputSchema: contribution.inputSchema };
}
