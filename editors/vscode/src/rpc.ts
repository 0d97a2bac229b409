/**
 * A small JSON-RPC 2.0 client over newline-delimited JSON (editor protocol v1, stdio transport).
 *
 * Owns: framing (one JSON object per line, UTF-8, split on bytes so multi-byte characters cut by a chunk
 * boundary survive), request ids, matching responses to requests, error objects, and routing notifications that
 * carry `params.requestId` (such as `lm/part`) to the request they belong to; and the server's own requests (such as
 * `editor/chat`), answered by handlers and cancelled by the server's `$/cancelRequest`. It knows nothing about
 * lmbridge's methods; see bridge.ts for those. No dependencies beyond Node.
 */

import type { Readable, Writable } from 'node:stream';

/** JSON-RPC error codes that editor protocol v1 uses (docs/protocol.md, "Errors"). */
export const ErrorCodes = {
    ParseError: -32700,
    InvalidRequest: -32600,
    MethodNotFound: -32601,
    InvalidParams: -32602,
    InternalError: -32603,
    RequestCancelled: -32800,
    AgentStartFailed: -32001,
    AgentExited: -32002,
    AgentError: -32003,
} as const;

/** An error object the server answered with: `{code, message, data?}`. */
export class RpcError extends Error {
    constructor(readonly code: number, message: string, readonly data?: unknown, readonly method?: string) {
        super(message);
        this.name = 'RpcError';
    }
}

/** The connection is gone (the process exited, the stream closed): every pending request is rejected with it. */
export class ConnectionClosedError extends Error {
    constructor(message: string) {
        super(message);
        this.name = 'ConnectionClosedError';
    }
}

export type RequestId = number;
export type NotificationHandler = (method: string, params: any) => void;
/** Answers a request of the server: its result, or an `RpcError` thrown for an error answer. `signal` aborts when the
 * server cancels the request (`$/cancelRequest`). */
export type RequestHandler = (params: any, signal: AbortSignal, id: number | string) => Promise<unknown>;

export interface RpcLogger {
    trace(message: string): void;
    warn(message: string): void;
}

interface Pending {
    method: string;
    /** The write of the request failed (EPIPE: the process was gone), so the server never saw it. */
    undelivered: boolean;
    resolve(value: unknown): void;
    reject(error: Error): void;
    onNotification?: NotificationHandler;
}

export interface PendingRequest<T> {
    readonly id: RequestId;
    readonly result: Promise<T>;
    /** True once writing the request failed: the server never received it, so sending it again is safe. */
    readonly undelivered: boolean;
}

export class JsonRpcClient {
    private nextId = 1;
    private readonly pending = new Map<RequestId, Pending>();
    private readonly handlers = new Map<string, NotificationHandler>();
    private readonly requestHandlers = new Map<string, RequestHandler>();
    /** The server's requests being answered now, by id: aborted by its `$/cancelRequest`. */
    private readonly incoming = new Map<number | string, AbortController>();
    private buffer: Buffer = Buffer.alloc(0);
    private closedWith: Error | undefined;

    /**
     * @param input the server's output (a child's stdout): responses and notifications arrive here.
     * @param output the server's input (a child's stdin): requests and notifications are written here.
     */
    constructor(input: Readable, private readonly output: Writable, private readonly log?: RpcLogger,
        options: { closeOnEnd?: boolean } = {}) {
        input.on('data', (chunk: Buffer | string) => this.receive(typeof chunk === 'string' ? Buffer.from(chunk) : chunk));
        if (options.closeOnEnd ?? true) {
            // A process owner passes false and calls close() itself once it knows the exit status and stderr.
            input.on('end', () => this.close(new ConnectionClosedError('the connection to lmbridge was closed')));
        }
        input.on('error', (error: Error) => this.close(new ConnectionClosedError(`reading from lmbridge failed: ${error.message}`)));
        // A write to a process that died raises EPIPE here; the exit handler reports the real reason.
        output.on('error', (error: Error) => this.log?.warn(`writing to lmbridge failed: ${error.message}`));
    }

    get isClosed(): boolean {
        return this.closedWith !== undefined;
    }

    get pendingCount(): number {
        return this.pending.size;
    }

    /** Handle notifications of `method` that no pending request claims (see `request`'s `onNotification`). */
    onNotification(method: string, handler: NotificationHandler): void {
        this.handlers.set(method, handler);
    }

    /** Answer the server's requests of `method` with `handler` (others get "method not found"). */
    onRequest(method: string, handler: RequestHandler): void {
        this.requestHandlers.set(method, handler);
    }

    /**
     * Send a request. `onNotification` receives every notification whose `params.requestId` is this request's id,
     * until the response arrives (protocol v1 sends all parts of a turn before its answer).
     */
    request<T = unknown>(method: string, params?: unknown, onNotification?: NotificationHandler): PendingRequest<T> {
        const id = this.nextId++;
        if (this.closedWith) {
            return { id, result: Promise.reject(this.closedWith), undelivered: true };
        }
        let entry!: Pending;
        const result = new Promise<T>((resolve, reject) => {
            entry = { method, undelivered: false, resolve: resolve as (value: unknown) => void, reject, onNotification };
            this.pending.set(id, entry);
        });
        this.send({ jsonrpc: '2.0', id, method, params: params ?? null }, () => { entry.undelivered = true; });
        return { id, result, get undelivered() { return entry.undelivered; } };
    }

    notify(method: string, params?: unknown): void {
        if (this.closedWith) {
            return;
        }
        this.send({ jsonrpc: '2.0', method, params: params ?? null });
    }

    /** Reject every pending request with `error` and refuse new ones. Idempotent: the first reason wins. */
    close(error: Error): void {
        if (this.closedWith) {
            return;
        }
        this.closedWith = error;
        for (const controller of this.incoming.values()) {
            controller.abort();
        }
        this.incoming.clear();
        const pending = [...this.pending.values()];
        this.pending.clear();
        for (const request of pending) {
            request.reject(error);
        }
    }

    private send(message: object, onWriteError?: () => void): void {
        const line = JSON.stringify(message);
        // Written before it is logged: a logger that throws (a closed output channel) must not stop a message.
        this.output.write(line + '\n', error => {
            if (error) {
                onWriteError?.();
            }
        });
        this.log?.trace(`→ ${line.length > 2000 ? line.slice(0, 2000) + '…' : line}`);
    }

    private receive(chunk: Buffer): void {
        this.buffer = this.buffer.length ? Buffer.concat([this.buffer, chunk]) : chunk;
        let start = 0;
        for (; ;) {
            const newline = this.buffer.indexOf(0x0a, start);
            if (newline < 0) {
                break;
            }
            const line = this.buffer.subarray(start, newline).toString('utf8').trim();
            start = newline + 1;
            if (line) {
                this.dispatchLine(line);
            }
        }
        this.buffer = start >= this.buffer.length ? Buffer.alloc(0) : this.buffer.subarray(start);
    }

    private dispatchLine(line: string): void {
        this.log?.trace(`← ${line.length > 2000 ? line.slice(0, 2000) + '…' : line}`);
        let message: any;
        try {
            message = JSON.parse(line);
        } catch {
            this.log?.warn(`lmbridge wrote a line that is not JSON (ignored): ${line.slice(0, 200)}`);
            return;
        }
        if (message === null || typeof message !== 'object' || Array.isArray(message)) {
            this.log?.warn(`lmbridge wrote something that is not a JSON-RPC message (ignored): ${line.slice(0, 200)}`);
            return;
        }
        if (typeof message.method === 'string') {
            if (message.id !== undefined && message.id !== null) {
                this.answerRequest(message.id, message.method, message.params);
                return;
            }
            if (message.method === '$/cancelRequest') {
                this.incoming.get(message.params?.id)?.abort();
                return;
            }
            this.dispatchNotification(message.method, message.params);
            return;
        }
        const id = message.id;
        const request = typeof id === 'number' ? this.pending.get(id) : undefined;
        if (!request) {
            if (message.error) {
                this.log?.warn(`lmbridge error not tied to a request: ${JSON.stringify(message.error)}`);
            } else {
                this.log?.warn(`response to an unknown request id ${JSON.stringify(id)} (ignored)`);
            }
            return;
        }
        this.pending.delete(id);
        if (message.error !== undefined) {
            const error = message.error ?? {};
            const code = typeof error.code === 'number' ? error.code : ErrorCodes.InternalError;
            const text = typeof error.message === 'string' ? error.message : JSON.stringify(error);
            request.reject(new RpcError(code, text, error.data, request.method));
        } else {
            request.resolve(message.result);
        }
    }

    private answerRequest(id: number | string, method: string, params: any): void {
        const handler = this.requestHandlers.get(method);
        if (!handler) {
            // Answered, so that a newer server is not left waiting.
            this.send({ jsonrpc: '2.0', id, error: { code: ErrorCodes.MethodNotFound, message: `Method not found: ${method}` } });
            return;
        }
        const controller = new AbortController();
        this.incoming.set(id, controller);
        handler(params, controller.signal, id).then(
            result => {
                if (!this.closedWith) {
                    this.send({ jsonrpc: '2.0', id, result: result ?? null });
                }
            },
            (error: unknown) => {
                if (this.closedWith) {
                    return;
                }
                const rpc = error instanceof RpcError ? error : new RpcError(ErrorCodes.InternalError, String((error as Error)?.message ?? error));
                const body: Record<string, unknown> = { code: rpc.code, message: rpc.message };
                if (rpc.data !== undefined) {
                    body.data = rpc.data;
                }
                this.send({ jsonrpc: '2.0', id, error: body });
            },
        ).finally(() => this.incoming.delete(id));
    }

    private dispatchNotification(method: string, params: any): void {
        const requestId = params && typeof params === 'object' ? params.requestId : undefined;
        if (typeof requestId === 'number') {
            const request = this.pending.get(requestId);
            if (request?.onNotification) {
                request.onNotification(method, params);
                return;
            }
        }
        const handler = this.handlers.get(method);
        if (handler) {
            handler(method, params);
        } else {
            this.log?.trace(`notification ${method} not handled`);
        }
    }
}
