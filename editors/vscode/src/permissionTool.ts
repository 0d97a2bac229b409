/**
 * The permission tool (`acp_agent_action`, docs/protocol.md "Permissions"). When an agent asks permission, the
 * lmbridge turn ends with a call of this tool; VS Code shows the confirmation built here (what the agent wants to
 * do: title, kind, command, paths, the options it offers) with its Continue/Skip buttons.
 *
 * Continue runs `invoke`, which answers "allow" (allow once). Skip never reaches the extension: VS Code answers the
 * call itself with "The user chose to skip the tool call", which lmbridge reads as a rejection.
 *
 * An agent's question (kind `elicitation`, docs/protocol.md "Agent questions") asks the person after Continue: a pick
 * among the offered values, an input box per field of a form (answered as a JSON object), or the page to visit,
 * opened in the browser. Escape declines.
 */

import * as vscode from 'vscode';

export const PERMISSION_TOOL_NAME = 'acp_agent_action';

export interface PermissionOption {
    optionId: string;
    name: string;
    kind: string;
}

export interface PermissionInput {
    title: string;
    kind?: string;
    command?: string;
    paths?: string[];
    details?: unknown;
    options?: PermissionOption[];
}

const KIND_LABELS: Record<string, string> = {
    read: 'read files',
    edit: 'edit files',
    delete: 'delete files',
    move: 'move files',
    search: 'search',
    execute: 'run a command',
    think: 'think',
    fetch: 'fetch from the network',
    switch_mode: 'switch mode',
    other: 'act',
    elicitation: 'ask you a question',
};

const DETAILS_MAX_CHARS = 4000;

export class PermissionTool implements vscode.LanguageModelTool<PermissionInput> {
    prepareInvocation(options: vscode.LanguageModelToolInvocationPrepareOptions<PermissionInput>): vscode.PreparedToolInvocation {
        const input = (options.input ?? {}) as PermissionInput;
        const title = oneLine(input.title) || 'an action';
        const kind = typeof input.kind === 'string' && input.kind ? input.kind : undefined;
        return {
            invocationMessage: `Agent action: ${title}`,
            confirmationMessages: {
                title: kind && KIND_LABELS[kind] ? `Allow the agent to ${KIND_LABELS[kind]}?` : 'Allow the agent\'s action?',
                message: new vscode.MarkdownString(confirmationMarkdown(input)),
            },
        };
    }

    async invoke(options?: vscode.LanguageModelToolInvocationOptions<PermissionInput>): Promise<vscode.LanguageModelToolResult> {
        // Reached only when the user confirmed: allow once (see the module comment for the other answers).
        const input = (options?.input ?? {}) as PermissionInput;
        const answer = input.kind === 'elicitation' ? await askTheQuestion(input) : 'allow';
        return new vscode.LanguageModelToolResult([new vscode.LanguageModelTextPart(answer)]);
    }
}

interface FormField {
    type?: string;
    title?: string;
    description?: string;
    enum?: unknown[];
}

/** The person's answer to an agent's question: an optionId, a form as JSON, or "decline" (Escape). */
async function askTheQuestion(input: PermissionInput): Promise<string> {
    const title = oneLine(input.title) || 'The agent asks';
    const details = (input.details && typeof input.details === 'object' ? input.details : {}) as { form?: any; url?: unknown };
    const offered = (Array.isArray(input.options) ? input.options : []).filter(o => o && o.optionId !== 'decline');
    if (typeof details.url === 'string') {
        await vscode.env.openExternal(vscode.Uri.parse(details.url));
        return 'accept';
    }
    const form = details.form && typeof details.form === 'object' ? details.form : undefined;
    if (!form || !offered.some(o => o.optionId === 'accept')) {
        const picked = await vscode.window.showQuickPick(offered.map(o => ({ label: o.name || o.optionId, optionId: o.optionId })),
            { title, ignoreFocusOut: true });
        return picked ? (picked as { optionId: string }).optionId : 'decline';
    }
    const values: Record<string, unknown> = {};
    const properties = (form.properties && typeof form.properties === 'object' ? form.properties : {}) as Record<string, FormField>;
    for (const [name, field] of Object.entries(properties)) {
        const label = oneLine(field?.title) || name;
        const about = [field?.type, oneLine(field?.description)].filter(Boolean).join(' — ');
        let value: string | undefined;
        if (field?.type === 'boolean' || Array.isArray(field?.enum)) {
            const labels = field?.type === 'boolean' ? ['true', 'false'] : (field.enum ?? []).map(String);
            value = (await vscode.window.showQuickPick(labels.map(l => ({ label: l })), { title: `${title}: ${label}`, ignoreFocusOut: true }))?.label;
        } else {
            value = await vscode.window.showInputBox({ title, prompt: `${label}${about ? ` (${about})` : ''}`, ignoreFocusOut: true });
        }
        if (value === undefined) {
            return 'decline';
        }
        values[name] = value;
    }
    return JSON.stringify(values);
}

/** The confirmation text: everything a person needs to decide, with untrusted text escaped. */
export function confirmationMarkdown(input: PermissionInput): string {
    const lines: string[] = [];
    lines.push(`**${escapeMarkdown(oneLine(input.title) || '(the agent gave no title)')}**`, '');
    if (typeof input.kind === 'string' && input.kind) {
        lines.push(`Kind: ${inlineCode(input.kind)}`, '');
    }
    if (typeof input.command === 'string' && input.command) {
        lines.push('Command:', '', codeBlock(input.command, 'sh'), '');
    }
    const paths = Array.isArray(input.paths) ? input.paths.filter(p => typeof p === 'string') : [];
    if (paths.length) {
        lines.push(paths.length === 1 ? 'Path:' : 'Paths:', '');
        for (const p of paths) {
            lines.push(`- ${inlineCode(p)}`);
        }
        lines.push('');
    }
    if (input.details !== undefined && input.details !== null && !(typeof input.details === 'object' && Object.keys(input.details as object).length === 0)) {
        let json: string;
        try {
            json = JSON.stringify(input.details, null, 2) ?? String(input.details);
        } catch {
            json = String(input.details);
        }
        if (json.length > DETAILS_MAX_CHARS) {
            json = json.slice(0, DETAILS_MAX_CHARS) + '\n…';
        }
        lines.push('Details:', '', codeBlock(json, 'json'), '');
    }
    const offered = Array.isArray(input.options) ? input.options.filter(o => o && typeof o === 'object') : [];
    if (offered.length) {
        lines.push(`The agent offers: ${offered.map(o => `${escapeMarkdown(oneLine(o.name) || o.optionId)} (${inlineCode(o.optionId ?? '')})`).join(', ')}.`);
    }
    lines.push('Continue allows this once; skipping rejects it.');
    return lines.join('\n');
}

function oneLine(value: unknown): string {
    return typeof value === 'string' ? value.replace(/\s+/g, ' ').trim() : '';
}

export function escapeMarkdown(text: string): string {
    return text.replace(/[\\`*_{}[\]()#+\-.!|<>~&]/g, ch => `\\${ch}`);
}

/** `text` as inline code, with a fence longer than any run of backticks in it. */
export function inlineCode(text: string): string {
    const flat = text.replace(/\r?\n/g, ' ');
    const fence = '`'.repeat(longestRun(flat, '`') + 1);
    const pad = flat.startsWith('`') || flat.endsWith('`') ? ' ' : '';
    return `${fence}${pad}${flat}${pad}${fence}`;
}

/** `text` as a fenced code block that its content cannot close. */
export function codeBlock(text: string, language: string): string {
    const fence = '`'.repeat(Math.max(3, longestRun(text, '`') + 1));
    return `${fence}${language}\n${text}\n${fence}`;
}

function longestRun(text: string, ch: string): number {
    let longest = 0;
    let current = 0;
    for (const c of text) {
        current = c === ch ? current + 1 : 0;
        longest = Math.max(longest, current);
    }
    return longest;
}
