/**
 * The lmbridge daemon as seen from the extension: one `lmbridge stdio` child process, spawned on first use,
 * initialized with the workspace folders, and spawned again on the next request after it died.
 *
 * Owns: the command line (settings → `--config`, `--log-level`, `--trace-dir`), the child's stderr (logged, and
 * its tail kept so that a daemon that dies says why), the `initialize` handshake, cancellation
 * (`$/cancelRequest`), retiring a daemon whose settings changed once its running requests are done, and a
 * graceful `shutdown`. Deliberately free of the `vscode` module so that it is easy to test.
 */

import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import * as os from 'node:os';
import * as path from 'node:path';
import { ConnectionClosedError, JsonRpcClient, type NotificationHandler, RpcError } from './rpc';

export const PROTOCOL_VERSION = 1;
const STDERR_TAIL_LINES = 40;
const SHUTDOWN_TIMEOUT_MS = 5000;
const KILL_TIMEOUT_MS = 2000;

export interface BridgeSettings {
    /** `lmbridge.path`; empty: `lmbridge` on PATH. */
    path: string;
    /** `lmbridge.configFile` → `--config`. */
    configFile: string;
    /** `lmbridge.logLevel` → `--log-level`. */
    logLevel: string;
    /** `lmbridge.traceDir` → `--trace-dir`. */
    traceDir: string;
    /** `lmbridge.http` → `--http` (HOST:PORT: the HTTP API beside this window's connection; empty: none). */
    http?: string;
}

export interface Logger {
    trace(message: string): void;
    debug(message: string): void;
    info(message: string): void;
    warn(message: string): void;
    error(message: string): void;
}

export interface BridgeOptions {
    settings(): BridgeSettings;
    /** Absolute paths; the first is the working directory of new agent sessions. */
    workspaceFolders(): string[];
    log: Logger;
    clientInfo: { name: string; version: string };
    /** Ask for the agent's thoughts (`capabilities.thinking`); only when the editor can show them. */
    thinking: boolean;
    env?: NodeJS.ProcessEnv;
    /** Called each time a daemon has answered `initialize`. */
    onInitialized?: (result: InitializeResult) => void;
    /** Called when lmbridge says its models changed (`lm/modelsChanged`: an agent showed its models or commands). */
    onModelsChanged?: () => void;
    /** The editor's own models to share with lmbridge, asked once each daemon is initialized and sent as
     * `editor/modelsChanged`: listing VS Code's models waits for every provider, this extension's own among them,
     * so it must never hold up the start (that would wait for itself). */
    editorModels?: () => Promise<object[] | undefined>;
    /** Answers lmbridge's `editor/chat`: `sendPart` streams each part (`editor/part`); `signal` aborts on its cancel. */
    answerEditorChat?: (params: any, sendPart: (part: object) => void, signal: AbortSignal) => Promise<object>;
}

export interface PermissionToolInfo {
    name: string;
    description: string;
    inputSchema: object;
}

export interface InitializeResult {
    protocolVersion: number;
    serverInfo?: { name: string; version: string };
    permissionTool?: PermissionToolInfo;
}

/** Cancellation as VS Code's `CancellationToken` offers it (structurally, to keep this module vscode-free). */
export interface CancellationLike {
    readonly isCancellationRequested: boolean;
    onCancellationRequested(listener: () => void): { dispose(): void };
}

/** lmbridge could not be started, or it stopped; `message` says why, with the tail of its stderr. */
export class BridgeProcessError extends Error {
    constructor(message: string, readonly exitCode?: number | null, readonly signal?: NodeJS.Signals | null,
        readonly stderr?: string) {
        super(message);
        this.name = 'BridgeProcessError';
    }
}

export function expandHome(value: string): string {
    if (value === '~') {
        return os.homedir();
    }
    if (value.startsWith('~/') || value.startsWith('~\\')) {
        return path.join(os.homedir(), value.slice(2));
    }
    return value;
}

/** The lmbridge program these settings name. */
export function lmbridgeProgram(settings: BridgeSettings): string {
    return settings.path.trim() ? expandHome(settings.path.trim()) : 'lmbridge';
}

/** `--config FILE` for the agents file these settings name; nothing for lmbridge's default. */
export function configArgs(settings: BridgeSettings): string[] {
    return settings.configFile.trim() ? ['--config', expandHome(settings.configFile.trim())] : [];
}

/** The command line for `lmbridge stdio` with these settings. */
export function commandLine(settings: BridgeSettings): { command: string; args: string[] } {
    const command = lmbridgeProgram(settings);
    const args = ['stdio', ...configArgs(settings)];
    if (settings.logLevel.trim()) {
        args.push('--log-level', settings.logLevel.trim());
    }
    if (settings.traceDir.trim()) {
        args.push('--trace-dir', expandHome(settings.traceDir.trim()));
    }
    if (settings.http?.trim()) {
        args.push('--http', settings.http.trim());
    }
    return { command, args };
}

/** One running `lmbridge stdio`. */
class Daemon {
    readonly rpc: JsonRpcClient;
    readonly initialized: Promise<InitializeResult>;
    readonly closed: Promise<void>;
    private readonly stderrLines: string[] = [];
    private stderrPartial = '';
    stopping = false;
    retired = false;
    exitError: BridgeProcessError | undefined;

    constructor(readonly child: ChildProcessWithoutNullStreams, readonly command: string, private readonly options: BridgeOptions,
        private readonly onGone: (daemon: Daemon) => void) {
        const log = options.log;
        this.rpc = new JsonRpcClient(child.stdout, child.stdin, { trace: m => log.trace(m), warn: m => log.warn(m) },
            { closeOnEnd: false });
        this.rpc.onNotification('lm/modelsChanged', () => options.onModelsChanged?.());
        const answer = options.answerEditorChat;
        if (answer) {
            this.rpc.onRequest('editor/chat', (params, signal, id) =>
                answer(params, part => this.rpc.notify('editor/part', { requestId: id, part }), signal));
        }
        child.stderr.setEncoding('utf8');
        child.stderr.on('data', (chunk: string) => this.stderr(chunk));
        let closeResolve!: () => void;
        this.closed = new Promise(resolve => { closeResolve = resolve; });
        child.on('error', (error: NodeJS.ErrnoException) => {
            // Spawning failed (ENOENT, EACCES): 'close' follows, or may not; end everything here.
            this.gone(new BridgeProcessError(spawnErrorMessage(command, error)));
            closeResolve();
        });
        child.on('close', (code, signal) => {
            this.flushStderr();
            const tail = this.stderrTail();
            let message: string;
            if (this.stopping) {
                message = 'lmbridge was stopped';
            } else {
                message = exitMessage(command, code, signal, this.stderrLines, tail);
            }
            this.gone(new BridgeProcessError(message, code, signal, tail));
            closeResolve();
        });
        this.initialized = this.rpc.request<InitializeResult>('initialize', {
            protocolVersion: PROTOCOL_VERSION,
            clientInfo: options.clientInfo,
            workspaceFolders: options.workspaceFolders(),
            capabilities: { thinking: options.thinking, acpUpdates: false },
        }).result;
        // Nobody may be waiting yet; the rejection is reported through ready().
        this.initialized.catch(() => undefined);
    }

    get pid(): number | undefined {
        return this.child.pid;
    }

    /**
     * False as soon as anything says the process is gone: its exit (which comes before 'close', whose stderr and
     * status make the error message) or a broken stdin.
     */
    get usable(): boolean {
        return !this.exitError && this.child.exitCode === null && this.child.signalCode === null &&
            !this.child.stdin.destroyed && this.child.stdin.writable;
    }

    stderrTail(lines = STDERR_TAIL_LINES): string {
        return this.stderrLines.slice(-lines).join('\n');
    }

    /** Graceful stop: `shutdown` (running turns end `cancelled`), then SIGTERM, then SIGKILL. */
    async stop(): Promise<void> {
        if (this.exitError) {
            return;
        }
        this.stopping = true;
        const shutdown = this.rpc.request('shutdown', null).result.catch(() => undefined);
        const closed = this.closed;
        if (await within(Promise.all([shutdown, closed]), SHUTDOWN_TIMEOUT_MS)) {
            return;
        }
        this.options.log.warn(`lmbridge (pid ${this.pid}) did not stop after shutdown; sending SIGTERM`);
        this.child.kill('SIGTERM');
        if (await within(closed, KILL_TIMEOUT_MS)) {
            return;
        }
        this.child.kill('SIGKILL');
        await closed;
    }

    private gone(error: BridgeProcessError): void {
        if (this.exitError) {
            return;
        }
        this.exitError = error;
        this.rpc.close(error);
        if (this.stopping) {
            this.options.log.info(`lmbridge (pid ${this.pid}) stopped`);
        } else {
            this.options.log.error(error.message);
        }
        this.onGone(this);
    }

    private stderr(chunk: string): void {
        const text = this.stderrPartial + chunk;
        const lines = text.split(/\r?\n/);
        this.stderrPartial = lines.pop() ?? '';
        for (const line of lines) {
            this.stderrLine(line);
        }
    }

    private flushStderr(): void {
        if (this.stderrPartial) {
            this.stderrLine(this.stderrPartial);
            this.stderrPartial = '';
        }
    }

    private stderrLine(line: string): void {
        if (!line.trim()) {
            return;
        }
        this.options.log.info(`[lmbridge] ${line}`);
        this.stderrLines.push(line);
        if (this.stderrLines.length > STDERR_TAIL_LINES * 2) {
            this.stderrLines.splice(0, this.stderrLines.length - STDERR_TAIL_LINES);
        }
    }
}

const CONFIG_ERROR_PREFIX = 'lmbridge: configuration error:';

/** Why lmbridge stopped, for the user: a configuration error said plainly, otherwise the status and stderr's end. */
export function exitMessage(command: string, code: number | null, signal: NodeJS.Signals | null, stderrLines: readonly string[],
    tail: string): string {
    const status = code !== null ? `status ${code}` : `signal ${signal}`;
    // lmbridge exits 2 with one "configuration error" line naming the file, line and key (docs/configuration.md).
    const configError = code === 2 ? [...stderrLines].reverse().find(line => line.startsWith(CONFIG_ERROR_PREFIX)) : undefined;
    if (configError) {
        return `lmbridge could not start (${status}): ${configError.slice('lmbridge: '.length).trim()}. Fix the file (or the ` +
            '"lmbridge.configFile" setting); the next request starts lmbridge again.';
    }
    return `lmbridge (${command}) exited unexpectedly (${status})` + (tail ? `:\n${tail}` : ', with nothing on stderr');
}

function spawnErrorMessage(command: string, error: NodeJS.ErrnoException): string {
    if (error.code === 'ENOENT') {
        return `could not start lmbridge: '${command}' was not found. Install lmbridge (it needs Python 3.11+) and put it on PATH, ` +
            'or set the "lmbridge.path" setting to the lmbridge program.';
    }
    if (error.code === 'EACCES') {
        return `could not start lmbridge: '${command}' is not executable (EACCES). Check the "lmbridge.path" setting.`;
    }
    return `could not start lmbridge ('${command}'): ${error.message}`;
}

/** True if `promise` settled within `ms` milliseconds. */
async function within(promise: Promise<unknown>, ms: number): Promise<boolean> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<boolean>(resolve => { timer = setTimeout(() => resolve(false), ms); });
    try {
        return await Promise.race([promise.then(() => true, () => true), timeout]);
    } finally {
        clearTimeout(timer);
    }
}

export interface RequestOptions {
    token?: CancellationLike;
    /** Notifications (`lm/part`) carrying this request's id. */
    onNotification?: NotificationHandler;
    /** Called with the request id once it has been sent (for logs and tests). */
    onSent?: (id: number) => void;
}

export class LmBridge {
    private daemon: Daemon | undefined;
    private starting: Promise<Daemon> | undefined;
    private readonly retiring = new Set<Daemon>();
    private disposed = false;
    /** Incremented by invalidate(): a daemon started under an older generation is not used. */
    private generation = 0;
    private permissionToolInfo: PermissionToolInfo | undefined;

    constructor(private readonly options: BridgeOptions) { }

    /** What the running daemon answered to `initialize`, once it has. */
    get permissionTool(): PermissionToolInfo | undefined {
        return this.permissionToolInfo;
    }

    /** The pid of the current daemon, if one is running (for the log and tests). */
    get pid(): number | undefined {
        return this.daemon?.pid;
    }

    /** Tell the running lmbridge (if any) which models this editor shares now (`editor/modelsChanged`); a daemon
     * started later asks `editorModels` itself. */
    shareModels(models: object[]): void {
        const daemon = this.daemon;
        if (daemon?.usable) {
            daemon.rpc.notify('editor/modelsChanged', { models });
        }
    }

    private async shareModelsWith(daemon: Daemon): Promise<void> {
        try {
            const models = await this.options.editorModels?.();
            if (models?.length && daemon.usable) {
                daemon.rpc.notify('editor/modelsChanged', { models });
            }
        } catch (error) {
            this.options.log.warn(`could not list the editor's models to share: ${(error as Error)?.message ?? error}`);
        }
    }

    /** Resolves when the current daemon's process has closed (undefined if none is running). */
    get currentClosed(): Promise<void> | undefined {
        return this.daemon?.closed;
    }

    /**
     * Send one request to the daemon, starting it (again) first if it is not running. A request whose daemon died
     * before anything of its answer arrived (no part, no result) is sent once more, to a new daemon. That is the case
     * of a daemon killed between two requests, whose exit is not yet seen when the next one is written: the write
     * may land in the dead process's pipe, and whether it was read cannot be told. Sending it again is what the user
     * would do, and it is safe: nothing of it reached the user, and the agents of the old daemon went with it (its
     * watchdog stops them), so the new daemon's agent starts from the conversation the request carries. A request
     * that had shown anything (a part) fails instead, saying the daemon exited, as does a second death in a row.
     */
    async request<T>(method: string, params: unknown, options: RequestOptions = {}): Promise<T> {
        for (let attempt = 1; ; attempt++) {
            const daemon = await this.ready();
            const token = options.token;
            if (token?.isCancellationRequested) {
                throw new RpcError(-32800, 'Request cancelled', undefined, method);
            }
            let heard = false;
            const onNotification: NotificationHandler = (notification, notificationParams) => {
                heard = true;
                options.onNotification?.(notification, notificationParams);
            };
            const pending = daemon.rpc.request<T>(method, params, onNotification);
            options.onSent?.(pending.id);
            const subscription = token?.onCancellationRequested(() => {
                daemon.rpc.notify('$/cancelRequest', { id: pending.id });
            });
            try {
                return await pending.result;
            } catch (error) {
                const diedUnderIt = error === daemon.exitError && !daemon.stopping && !heard && !token?.isCancellationRequested;
                if (attempt === 1 && diedUnderIt) {
                    const how = pending.undelivered ? 'had died when it was sent' : 'died before answering it';
                    this.options.log.info(`lmbridge (pid ${daemon.pid}) ${how} (${method}); sending it to a new lmbridge`);
                    continue;
                }
                throw error;
            } finally {
                subscription?.dispose();
                if (daemon.retired && daemon.rpc.pendingCount === 0) {
                    void this.stopDaemon(daemon);
                }
            }
        }
    }

    /** A started and initialized daemon. */
    async ready(): Promise<Daemon> {
        if (this.disposed) {
            throw new BridgeProcessError('the lmbridge extension is shutting down');
        }
        if (this.daemon?.usable) {
            return this.daemon;
        }
        if (!this.starting) {
            this.starting = this.start().finally(() => { this.starting = undefined; });
        }
        return this.starting;
    }

    /**
     * Settings or workspace folders changed: new requests go to a new daemon; the current one is shut down once its
     * running requests are done (so that a settings change does not cut a turn short).
     */
    invalidate(): void {
        this.generation++;
        const daemon = this.daemon;
        this.daemon = undefined;
        if (daemon && !daemon.exitError) {
            daemon.retired = true;
            if (daemon.rpc.pendingCount === 0) {
                void this.stopDaemon(daemon);
            } else {
                this.retiring.add(daemon);
            }
        }
    }

    /** Stop the daemon now (running turns end `cancelled`); the next request starts a new one. */
    async restart(): Promise<void> {
        const daemon = this.daemon;
        this.daemon = undefined;
        if (daemon) {
            await this.stopDaemon(daemon);
        }
    }

    async dispose(): Promise<void> {
        this.disposed = true;
        const starting = this.starting?.catch(() => undefined);
        await starting;
        const daemons = [this.daemon, ...this.retiring].filter((d): d is Daemon => d !== undefined);
        this.daemon = undefined;
        await Promise.all(daemons.map(d => this.stopDaemon(d)));
    }

    private async stopDaemon(daemon: Daemon): Promise<void> {
        this.retiring.delete(daemon);
        await daemon.stop();
    }

    private async start(): Promise<Daemon> {
        for (; ;) {
            const generation = this.generation;
            const daemon = await this.startOne();
            if (generation === this.generation) {
                this.daemon = daemon;
                return daemon;
            }
            // The settings changed while it started: use a daemon started with the new ones.
            daemon.retired = true;
            void this.stopDaemon(daemon);
        }
    }

    private async startOne(): Promise<Daemon> {
        const { command, args } = commandLine(this.options.settings());
        const folders = this.options.workspaceFolders();
        this.options.log.info(`starting ${command} ${args.join(' ')}`);
        let child: ChildProcessWithoutNullStreams;
        try {
            child = spawn(command, args, {
                cwd: folders[0] ?? os.homedir(),
                env: this.options.env ?? process.env,
                stdio: ['pipe', 'pipe', 'pipe'],
                windowsHide: true,
            });
        } catch (error) {
            throw new BridgeProcessError(spawnErrorMessage(command, error as NodeJS.ErrnoException));
        }
        const daemon = new Daemon(child, command, this.options, gone => {
            if (this.daemon === gone) {
                this.daemon = undefined;
            }
            this.retiring.delete(gone);
        });
        try {
            const result = await daemon.initialized;
            if (result?.protocolVersion !== PROTOCOL_VERSION) {
                throw new BridgeProcessError(`lmbridge speaks protocol version ${result?.protocolVersion}; this extension needs ${PROTOCOL_VERSION}. ` +
                    'Update lmbridge or the extension.');
            }
            this.permissionToolInfo = result.permissionTool;
            this.options.log.info(`lmbridge ${result.serverInfo?.version ?? '?'} ready (pid ${daemon.pid})`);
            this.options.onInitialized?.(result);
            void this.shareModelsWith(daemon);
        } catch (error) {
            const exited = daemon.exitError;
            if (exited) {
                throw exited; // it could not be started or died: the exit error says why, with its stderr
            }
            void daemon.stop();
            if (error instanceof ConnectionClosedError) {
                throw new BridgeProcessError(`lmbridge closed its output during initialize: ${error.message}`);
            }
            if (error instanceof RpcError) {
                throw new BridgeProcessError(`lmbridge refused to initialize: ${error.message} (JSON-RPC error ${error.code})`);
            }
            throw error;
        }
        if (this.disposed) {
            await daemon.stop();
            throw new BridgeProcessError('the lmbridge extension is shutting down');
        }
        return daemon;
    }
}
