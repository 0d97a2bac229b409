/**
 * A small fake of the `vscode` module: the classes and namespaces the extension uses, with the behaviour of
 * VS Code's `vscode.d.ts` (version 1.106) where the extension relies on it. `register.ts` makes `require('vscode')`
 * resolve to this file. `fake` is the tests' handle: settings, registered providers and tools, log lines.
 */

/* eslint-disable @typescript-eslint/no-explicit-any */

export enum LanguageModelChatMessageRole {
    User = 1,
    Assistant = 2,
}

export enum LanguageModelChatToolMode {
    Auto = 1,
    Required = 2,
}

export class LanguageModelTextPart {
    constructor(public value: string) { }
}

export class LanguageModelToolCallPart {
    constructor(public callId: string, public name: string, public input: object) { }
}

export class LanguageModelToolResultPart {
    constructor(public callId: string, public content: unknown[]) { }
}

export class LanguageModelPromptTsxPart {
    constructor(public value: unknown) { }
}

export class LanguageModelDataPart {
    constructor(public data: Uint8Array, public mimeType: string) { }

    static image(data: Uint8Array, mime: string): LanguageModelDataPart {
        return new LanguageModelDataPart(data, mime);
    }

    static json(value: unknown, mime = 'application/json'): LanguageModelDataPart {
        return new LanguageModelDataPart(Buffer.from(JSON.stringify(value)), mime);
    }

    static text(value: string, mime = 'text/plain'): LanguageModelDataPart {
        return new LanguageModelDataPart(Buffer.from(value), mime);
    }
}

export class LanguageModelToolResult {
    constructor(public content: unknown[]) { }
}

export class LanguageModelChatMessage {
    static User(content: string | unknown[], name?: string): LanguageModelChatMessage {
        return new LanguageModelChatMessage(LanguageModelChatMessageRole.User, content, name);
    }

    static Assistant(content: string | unknown[], name?: string): LanguageModelChatMessage {
        return new LanguageModelChatMessage(LanguageModelChatMessageRole.Assistant, content, name);
    }

    content: unknown[];

    constructor(public role: number, content: string | unknown[], public name?: string) {
        // As in VS Code: a string becomes one text part.
        this.content = typeof content === 'string' ? [new LanguageModelTextPart(content)] : content;
    }
}

export class MarkdownString {
    isTrusted?: boolean;
    supportHtml?: boolean;

    constructor(public value = '') { }

    appendText(value: string): this {
        this.value += value.replace(/[\\`*_{}[\]()#+\-.!]/g, '\\$&');
        return this;
    }

    appendMarkdown(value: string): this {
        this.value += value;
        return this;
    }
}

export class Disposable {
    static from(...items: { dispose(): unknown }[]): Disposable {
        return new Disposable(() => items.forEach(item => item.dispose()));
    }

    constructor(private readonly callOnDispose: () => unknown) { }

    dispose(): void {
        this.callOnDispose();
    }
}

export type Event<T> = (listener: (value: T) => unknown) => Disposable;

export class EventEmitter<T> {
    private listeners = new Set<(value: T) => unknown>();

    readonly event: Event<T> = listener => {
        this.listeners.add(listener);
        return new Disposable(() => this.listeners.delete(listener));
    };

    fire(value: T): void {
        for (const listener of [...this.listeners]) {
            listener(value);
        }
    }

    dispose(): void {
        this.listeners.clear();
    }
}

export interface CancellationToken {
    isCancellationRequested: boolean;
    onCancellationRequested: Event<void>;
}

export class CancellationTokenSource {
    private readonly emitter = new EventEmitter<void>();
    private cancelled = false;
    readonly token: CancellationToken;

    constructor() {
        const source = this;
        this.token = {
            get isCancellationRequested() {
                return source.cancelled;
            },
            onCancellationRequested: listener => {
                if (source.cancelled) {
                    // As VS Code does: a listener added after cancellation is called, asynchronously.
                    const timer = setTimeout(() => listener(undefined));
                    return new Disposable(() => clearTimeout(timer));
                }
                return source.emitter.event(listener);
            },
        };
    }

    cancel(): void {
        if (!this.cancelled) {
            this.cancelled = true;
            this.emitter.fire(undefined);
        }
    }

    dispose(): void {
        this.emitter.dispose();
    }
}

export const Uri = {
    file(fsPath: string) {
        return { scheme: 'file', fsPath, path: fsPath, toString: () => `file://${fsPath}` };
    },
    parse(value: string) {
        return { scheme: value.split(':')[0], fsPath: '', path: value, toString: () => value };
    },
};

// -- the tests' handle ------------------------------------------------------------------------------------------

const configurationChanged = new EventEmitter<{ affectsConfiguration(section: string): boolean }>();
const workspaceFoldersChanged = new EventEmitter<unknown>();

export const fake = {
    settings: new Map<string, unknown>(),
    /** What `vscode.lm.selectChatModels` lists (other vendors' models); `fireModelsChanged` announces a change. */
    chatModels: [] as FakeChatModel[],
    fireModelsChanged(): void {
        modelsChanged.fire();
    },
    workspaceFolders: [] as string[],
    providers: new Map<string, any>(),
    tools: new Map<string, any>(),
    commands: new Map<string, (...args: any[]) => unknown>(),
    log: [] as string[],
    errorMessages: [] as string[],
    infoMessages: [] as string[],
    /** What the person types or picks next (undefined: Escape), in order; and what they were shown. */
    answers: [] as (string | undefined)[],
    prompts: [] as string[],
    opened: [] as string[],

    /** Change settings (keys without the `lmbridge.` prefix) and fire onDidChangeConfiguration. */
    configure(values: Record<string, unknown>): void {
        for (const [key, value] of Object.entries(values)) {
            fake.settings.set(key, value);
        }
        configurationChanged.fire({ affectsConfiguration: (section: string) => section === 'lmbridge' || section.startsWith('lmbridge.') });
    },

    reset(): void {
        fake.settings.clear();
        fake.chatModels = [];
        fake.workspaceFolders = [];
        fake.providers.clear();
        fake.tools.clear();
        fake.commands.clear();
        fake.log.length = 0;
        fake.errorMessages.length = 0;
        fake.infoMessages.length = 0;
        fake.answers.length = 0;
        fake.prompts.length = 0;
        fake.opened.length = 0;
    },
};

export const workspace = {
    get workspaceFolders() {
        return fake.workspaceFolders.map((folder, index) => ({ uri: Uri.file(folder), name: folder, index }));
    },
    getConfiguration(section: string) {
        return {
            get<T>(key: string, defaultValue?: T): T | undefined {
                const value = fake.settings.get(section === 'lmbridge' ? key : `${section}.${key}`);
                return (value === undefined ? defaultValue : value) as T | undefined;
            },
        };
    },
    onDidChangeConfiguration: configurationChanged.event,
    onDidChangeWorkspaceFolders: workspaceFoldersChanged.event,
};

function logChannel(name: string) {
    const line = (level: string) => (message: string) => {
        fake.log.push(`[${level}] ${message}`);
        if (process.env.LMBRIDGE_TEST_LOG) {
            process.stderr.write(`${name} [${level}] ${message}\n`);
        }
    };
    return {
        name,
        trace: line('trace'),
        debug: line('debug'),
        info: line('info'),
        warn: line('warning'),
        error: line('error'),
        appendLine: line('info'),
        append: line('info'),
        show() { /* nothing to show */ },
        hide() { /* nothing to hide */ },
        clear() { /* keep the lines for the tests */ },
        dispose() { /* nothing to free */ },
    };
}

export const window = {
    createOutputChannel(name: string) {
        return logChannel(name);
    },
    showErrorMessage(message: string): Promise<string | undefined> {
        fake.errorMessages.push(message);
        return Promise.resolve(undefined);
    },
    showInformationMessage(message: string): Promise<string | undefined> {
        fake.infoMessages.push(message);
        return Promise.resolve(undefined);
    },
    showInputBox(options: { prompt?: string }): Promise<string | undefined> {
        fake.prompts.push(options?.prompt ?? '');
        return Promise.resolve(fake.answers.shift());
    },
    showQuickPick(items: { label: string }[], options: { title?: string }): Promise<{ label: string } | undefined> {
        fake.prompts.push(`${options?.title ?? ''}: ${items.map(i => i.label).join(' | ')}`);
        const label = fake.answers.shift();
        return Promise.resolve(items.find(i => i.label === label));
    },
};

export const env = {
    openExternal(uri: { toString(): string }): Promise<boolean> {
        fake.opened.push(uri.toString());
        return Promise.resolve(true);
    },
};

export const commands = {
    registerCommand(id: string, handler: (...args: any[]) => unknown): Disposable {
        fake.commands.set(id, handler);
        return new Disposable(() => fake.commands.delete(id));
    },
    executeCommand(id: string, ...args: unknown[]): Promise<unknown> {
        const handler = fake.commands.get(id);
        return Promise.resolve(handler ? handler(...args) : undefined);
    },
};

/** As VS Code's: errors of a language model request, each kind with its `code`. */
export class LanguageModelError extends Error {
    static NoPermissions(message?: string): LanguageModelError {
        return new LanguageModelError(message ?? 'no permissions', 'NoPermissions');
    }

    static Blocked(message?: string): LanguageModelError {
        return new LanguageModelError(message ?? 'blocked', 'Blocked');
    }

    static NotFound(message?: string): LanguageModelError {
        return new LanguageModelError(message ?? 'not found', 'NotFound');
    }

    constructor(message: string, readonly code: string) {
        super(message);
    }
}

/** A chat model of another vendor, as `vscode.lm.selectChatModels` hands it out: `respond` scripts its answer. */
export interface FakeChatModel {
    id: string;
    name: string;
    vendor: string;
    family: string;
    version: string;
    maxInputTokens: number;
    sendRequest(messages: LanguageModelChatMessage[], options: any, token: CancellationToken): Promise<{ stream: AsyncIterable<unknown> }>;
}

const modelsChanged = new EventEmitter<void>();

export const lm = {
    selectChatModels(selector?: { vendor?: string; id?: string }): Promise<FakeChatModel[]> {
        return Promise.resolve(fake.chatModels.filter(m =>
            (!selector?.vendor || m.vendor === selector.vendor) && (!selector?.id || m.id === selector.id)));
    },
    onDidChangeChatModels: modelsChanged.event,
    registerLanguageModelChatProvider(vendor: string, provider: unknown): Disposable {
        if (fake.providers.has(vendor)) {
            throw new Error(`vendor ${vendor} registered twice`);
        }
        fake.providers.set(vendor, provider);
        return new Disposable(() => fake.providers.delete(vendor));
    },
    registerTool(name: string, tool: unknown): Disposable {
        if (fake.tools.has(name)) {
            throw new Error(`tool ${name} registered twice`);
        }
        fake.tools.set(name, tool);
        return new Disposable(() => fake.tools.delete(name));
    },
};
