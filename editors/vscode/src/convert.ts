/**
 * VS Code language model parts ⇄ editor protocol v1 parts (docs/protocol.md, "Messages and parts").
 *
 * To the bridge: Text → text, ToolCall → tool_call, ToolResult → tool_result (its text and data content),
 * Data → data (base64), role System (3, proposed `languageModelSystem`) → system. Thinking parts and unknown parts of
 * the history are left out (the bridge ignores thinking in history anyway).
 * From the bridge: text → LanguageModelTextPart, tool_call → LanguageModelToolCallPart, data → LanguageModelDataPart,
 * thinking → LanguageModelThinkingPart only where VS Code has that class (proposed API), else dropped.
 *
 * Parts are recognised with `instanceof` first and by shape second, so that parts built by another copy of the API
 * classes (another extension, a test) still convert.
 */

import * as vscode from 'vscode';

export type TextPart = { type: 'text'; value: string };
export type DataPart = { type: 'data'; mimeType: string; data: string };
export type ToolCallPart = { type: 'tool_call'; callId: string; name: string; input: unknown };
export type ToolResultPart = { type: 'tool_result'; callId: string; content: Array<TextPart | DataPart>; isError?: boolean };
export type ThinkingPart = { type: 'thinking'; value: string; id?: string };
export type ProtocolPart = TextPart | DataPart | ToolCallPart | ToolResultPart | ThinkingPart;
export type ProtocolRole = 'user' | 'assistant' | 'system';

export interface ProtocolMessage {
    role: ProtocolRole;
    content: ProtocolPart[];
    name?: string;
}

export interface ProtocolTool {
    name: string;
    description: string;
    inputSchema: object;
}

/** `vscode.LanguageModelChatMessageRole.System` of the proposed `languageModelSystem` API. */
export const SYSTEM_ROLE = 3;

export type ThinkingPartConstructor = new (value: string | string[], id?: string, metadata?: { readonly [key: string]: unknown }) => object;

export function toProtocolRole(role: number): ProtocolRole {
    switch (role) {
        case vscode.LanguageModelChatMessageRole.Assistant:
            return 'assistant';
        case SYSTEM_ROLE:
            return 'system';
        default:
            return 'user';
    }
}

export function toProtocolMessage(message: vscode.LanguageModelChatRequestMessage): ProtocolMessage {
    const content: ProtocolPart[] = [];
    const raw: ReadonlyArray<unknown> | string = message.content as ReadonlyArray<unknown> | string;
    if (typeof raw === 'string') {
        content.push({ type: 'text', value: raw });
    } else {
        for (const part of raw ?? []) {
            const converted = toProtocolPart(part);
            if (converted) {
                content.push(converted);
            }
        }
    }
    const result: ProtocolMessage = { role: toProtocolRole(message.role), content };
    if (typeof message.name === 'string' && message.name) {
        result.name = message.name;
    }
    return result;
}

export function toProtocolPart(part: unknown): ProtocolPart | undefined {
    if (part === null || typeof part !== 'object') {
        return undefined;
    }
    if (part instanceof vscode.LanguageModelTextPart) {
        return { type: 'text', value: part.value };
    }
    if (part instanceof vscode.LanguageModelToolCallPart) {
        return toolCall(part);
    }
    if (part instanceof vscode.LanguageModelToolResultPart) {
        return toolResult(part);
    }
    if (part instanceof vscode.LanguageModelDataPart) {
        return data(part);
    }
    // By shape: parts made by other copies of the classes.
    const p = part as Record<string, unknown>;
    if (isThinkingLike(part)) {
        return undefined;
    }
    if (typeof p.callId === 'string' && Array.isArray(p.content)) {
        return toolResult(p as unknown as vscode.LanguageModelToolResultPart);
    }
    if (typeof p.callId === 'string' && typeof p.name === 'string') {
        return toolCall(p as unknown as vscode.LanguageModelToolCallPart);
    }
    if (typeof p.mimeType === 'string' && p.data instanceof Uint8Array) {
        return data(p as unknown as vscode.LanguageModelDataPart);
    }
    if (typeof p.value === 'string') {
        return { type: 'text', value: p.value };
    }
    return undefined;
}

function isThinkingLike(part: object): boolean {
    const ctor = (vscode as unknown as Record<string, unknown>).LanguageModelThinkingPart;
    if (typeof ctor === 'function' && part instanceof (ctor as new (...args: never[]) => object)) {
        return true;
    }
    return part.constructor?.name === 'LanguageModelThinkingPart';
}

function toolCall(part: vscode.LanguageModelToolCallPart): ToolCallPart {
    return { type: 'tool_call', callId: part.callId, name: part.name, input: part.input ?? {} };
}

function data(part: vscode.LanguageModelDataPart): DataPart {
    return { type: 'data', mimeType: part.mimeType, data: Buffer.from(part.data).toString('base64') };
}

function toolResult(part: vscode.LanguageModelToolResultPart): ToolResultPart {
    const content: Array<TextPart | DataPart> = [];
    for (const item of part.content ?? []) {
        const converted = toolResultItem(item);
        if (converted) {
            content.push(converted);
        }
    }
    const result: ToolResultPart = { type: 'tool_result', callId: part.callId, content };
    const isError = (part as unknown as { isError?: unknown }).isError;
    if (typeof isError === 'boolean') {
        result.isError = isError;
    }
    return result;
}

function toolResultItem(item: unknown): TextPart | DataPart | undefined {
    if (item === null || item === undefined) {
        return undefined;
    }
    if (typeof item === 'string') {
        return { type: 'text', value: item };
    }
    if (typeof item !== 'object') {
        return { type: 'text', value: String(item) };
    }
    if (item instanceof vscode.LanguageModelTextPart) {
        return { type: 'text', value: item.value };
    }
    if (item instanceof vscode.LanguageModelDataPart) {
        return data(item);
    }
    if (item instanceof vscode.LanguageModelPromptTsxPart) {
        return { type: 'text', value: promptTsxText(item.value) };
    }
    const p = item as Record<string, unknown>;
    if (typeof p.mimeType === 'string' && p.data instanceof Uint8Array) {
        return data(p as unknown as vscode.LanguageModelDataPart);
    }
    if (typeof p.value === 'string') {
        return { type: 'text', value: p.value };
    }
    if ('value' in p) {
        return { type: 'text', value: promptTsxText(p.value) };
    }
    return { type: 'text', value: safeJson(item) };
}

/** The text of a `@vscode/prompt-tsx` element tree (its text chunks in order), or its JSON. */
export function promptTsxText(value: unknown): string {
    const texts: string[] = [];
    const walk = (node: unknown): void => {
        if (Array.isArray(node)) {
            node.forEach(walk);
        } else if (node && typeof node === 'object') {
            const n = node as Record<string, unknown>;
            if (typeof n.text === 'string') {
                texts.push(n.text);
            }
            for (const [key, child] of Object.entries(n)) {
                if (key !== 'text' && child && typeof child === 'object') {
                    walk(child);
                }
            }
        }
    };
    walk(value);
    return texts.length ? texts.join('') : safeJson(value);
}

function safeJson(value: unknown): string {
    try {
        return JSON.stringify(value) ?? String(value);
    } catch {
        return String(value);
    }
}

export function toProtocolTools(tools: readonly vscode.LanguageModelChatTool[] | undefined): ProtocolTool[] {
    return (tools ?? []).map(tool => ({
        name: tool.name,
        description: tool.description ?? '',
        inputSchema: (tool.inputSchema as object | undefined) ?? { type: 'object' },
    }));
}

export function toProtocolToolMode(mode: vscode.LanguageModelChatToolMode | undefined): 'auto' | 'required' {
    return mode === vscode.LanguageModelChatToolMode.Required ? 'required' : 'auto';
}

/** A part of an `lm/part` notification as a VS Code response part, or undefined to drop it. */
export function fromProtocolPart(part: any, thinking?: ThinkingPartConstructor): vscode.LanguageModelResponsePart | object | undefined {
    if (!part || typeof part !== 'object') {
        return undefined;
    }
    switch (part.type) {
        case 'text':
            return typeof part.value === 'string' ? new vscode.LanguageModelTextPart(part.value) : undefined;
        case 'tool_call': {
            if (typeof part.callId !== 'string' || typeof part.name !== 'string') {
                return undefined;
            }
            let input = part.input ?? {};
            if (typeof input === 'string') {
                try {
                    input = JSON.parse(input);
                } catch {
                    input = { input };
                }
            }
            if (typeof input !== 'object' || input === null) {
                input = { value: input };
            }
            return new vscode.LanguageModelToolCallPart(part.callId, part.name, input);
        }
        case 'thinking':
            if (thinking && (typeof part.value === 'string' || Array.isArray(part.value))) {
                return new thinking(part.value, typeof part.id === 'string' ? part.id : undefined);
            }
            return undefined;
        case 'data':
            if (typeof part.mimeType === 'string' && typeof part.data === 'string') {
                return new vscode.LanguageModelDataPart(Buffer.from(part.data, 'base64'), part.mimeType);
            }
            return undefined;
        default:
            return undefined; // forward compatible: unknown part types are ignored
    }
}
