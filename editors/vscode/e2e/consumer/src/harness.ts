/**
 * A small test harness for the extension host: named tests run one after another, each with a deadline, results
 * printed through `console.log` (VS Code forwards the extension host's console to the page, where ../run.py prints
 * it), and the outcome returned as the promise VS Code waits on. Plus what the tests share: the lmbridge
 * extension's exports, sending a request and collecting its parts with their arrival times, waiting for a
 * condition, and the state file through which the tests tell run.py what only it can check after the window closed.
 */

import * as fs from 'node:fs';
import * as vscode from 'vscode';

export const LMBRIDGE_EXTENSION_ID = 'lmbridge.lmbridge-vscode';
const PREFIX = '[e2e]';

export function log(message: string): void {
    console.log(`${PREFIX} ${message}`);
}

interface Test {
    name: string;
    body: () => Promise<void>;
    timeoutMs: number;
}

const tests: Test[] = [];

export function test(name: string, body: () => Promise<void>, timeoutMs = 30_000): void {
    tests.push({ name, body, timeoutMs });
}

export async function runAll(): Promise<void> {
    const failed: string[] = [];
    const started = Date.now();
    for (const t of tests) {
        const testStarted = Date.now();
        let timer: NodeJS.Timeout | undefined;
        try {
            await Promise.race([
                t.body(),
                new Promise((_, reject) => {
                    timer = setTimeout(() => reject(new Error(`timed out after ${t.timeoutMs} ms`)), t.timeoutMs);
                }),
            ]);
            log(`ok   ${t.name} (${Date.now() - testStarted} ms)`);
        } catch (error) {
            failed.push(t.name);
            log(`FAIL ${t.name} (${Date.now() - testStarted} ms): ${(error as Error)?.stack ?? String(error)}`);
        } finally {
            clearTimeout(timer);
        }
    }
    log(`${tests.length - failed.length} passed, ${failed.length} failed, ${Date.now() - started} ms`);
    if (failed.length) {
        throw new Error(`failed: ${failed.join('; ')}`);
    }
}

export function assert(condition: unknown, message: string): asserts condition {
    if (!condition) {
        throw new Error(`assertion failed: ${message}`);
    }
}

export function assertIncludes(text: string, expected: string, what: string): void {
    assert(text.includes(expected), `${what} should include ${JSON.stringify(expected)}, got ${JSON.stringify(text)}`);
}

/** What the lmbridge extension exports from `activate` (src/extension.ts, LmBridgeExtensionApi), as far as used here. */
export interface LmBridgeApi {
    bridge: {
        pid: number | undefined;
        request<T>(method: string, params: unknown): Promise<T>;
    };
    permissionTool: vscode.LanguageModelTool<object>;
}

export async function lmbridgeApi(): Promise<LmBridgeApi> {
    const extension = vscode.extensions.getExtension<LmBridgeApi>(LMBRIDGE_EXTENSION_ID);
    assert(extension, `${LMBRIDGE_EXTENSION_ID} is not installed`);
    return extension.activate();
}

export async function demoModel(): Promise<vscode.LanguageModelChat> {
    const models = await vscode.lm.selectChatModels({ vendor: 'lmbridge', id: 'demo' });
    assert(models.length === 1, `one lmbridge demo model, got ${models.length}`);
    return models[0];
}

export interface TimedPart {
    part: unknown;
    at: number;
}

export interface Collected {
    parts: TimedPart[];
    text: string;
    toolCalls: vscode.LanguageModelToolCallPart[];
    started: number;
    ended: number;
}

export async function collect(model: vscode.LanguageModelChat, messages: vscode.LanguageModelChatMessage[],
    options: vscode.LanguageModelChatRequestOptions = {}, token?: vscode.CancellationToken,
    onPart?: (part: unknown) => void): Promise<Collected> {
    const started = Date.now();
    const response = await model.sendRequest(messages, options, token);
    const parts: TimedPart[] = [];
    for await (const part of response.stream) {
        parts.push({ part, at: Date.now() });
        onPart?.(part);
    }
    return {
        parts,
        text: parts.map(p => p.part instanceof vscode.LanguageModelTextPart ? p.part.value : '').join(''),
        toolCalls: parts.map(p => p.part).filter((p): p is vscode.LanguageModelToolCallPart =>
            p instanceof vscode.LanguageModelToolCallPart),
        started,
        ended: Date.now(),
    };
}

/** Wait until `condition()` holds; for changes made by other processes (an lmbridge exiting, a setting applied). */
export async function until(condition: () => boolean | Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!(await condition())) {
        if (Date.now() > deadline) {
            throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
        }
        await new Promise(resolve => setTimeout(resolve, 20));
    }
}

export function alive(pid: number): boolean {
    try {
        process.kill(pid, 0);
        return true;
    } catch {
        return false;
    }
}

/** What run.py checks once the window has closed (see its `after_close`). */
export interface RunState {
    /** lmbridge processes the tests killed on purpose: they cannot have received `shutdown`. */
    killed: number[];
    /** Texts that must be in the notification center, each with the buttons it must offer. */
    notifications: { includes: string[]; buttons: string[] }[];
}

export const runState: RunState = { killed: [], notifications: [] };

export function saveRunState(): void {
    const file = process.env.LMBRIDGE_E2E_STATE;
    assert(file, 'LMBRIDGE_E2E_STATE is not set (run the tests with e2e/run.py)');
    fs.writeFileSync(file, JSON.stringify(runState, null, 2));
}
