/**
 * Readable text for what went wrong, for the chat view and the log: the bridge's JSON-RPC error (code, message and,
 * for agent failures, the tail of the agent's stderr and its exit code), or why the lmbridge process could not run.
 */

import { BridgeProcessError } from './bridge';
import { ConnectionClosedError, ErrorCodes, RpcError } from './rpc';

const STDERR_LINES_SHOWN = 20;

export function describeError(error: unknown): string {
    if (error instanceof RpcError) {
        return describeRpcError(error);
    }
    if (error instanceof BridgeProcessError || error instanceof ConnectionClosedError) {
        return error.message;
    }
    if (error instanceof Error) {
        return `lmbridge: ${error.message}`;
    }
    return `lmbridge: ${String(error)}`;
}

function describeRpcError(error: RpcError): string {
    const data = (error.data && typeof error.data === 'object' ? error.data : {}) as Record<string, unknown>;
    const lines: string[] = [];
    switch (error.code) {
        case ErrorCodes.AgentStartFailed:
        case ErrorCodes.AgentExited: {
            lines.push(`${error.message} (lmbridge error ${error.code})`);
            if (typeof data.exitCode === 'number') {
                lines.push(`Exit code: ${data.exitCode}`);
            }
            const stderr = typeof data.stderr === 'string' ? data.stderr.trimEnd() : '';
            if (stderr) {
                const tail = stderr.split(/\r?\n/).slice(-STDERR_LINES_SHOWN).join('\n');
                lines.push(`The agent's stderr ended with:\n${tail}`);
            } else {
                lines.push('The agent wrote nothing on stderr.');
            }
            break;
        }
        case ErrorCodes.AgentError: {
            lines.push(`${error.message} (lmbridge error ${error.code})`);
            const agentError = data.agentError as Record<string, unknown> | undefined;
            if (agentError && agentError.data !== undefined) {
                lines.push(`Details: ${truncate(JSON.stringify(agentError.data), 2000)}`);
            }
            break;
        }
        case ErrorCodes.InvalidParams: {
            const field = typeof data.field === 'string' ? ` (field ${data.field})` : '';
            lines.push(`lmbridge refused the request: ${error.message}${field} (JSON-RPC error ${error.code})`);
            break;
        }
        case ErrorCodes.RequestCancelled:
            lines.push(`lmbridge: the request was cancelled (${error.method ?? 'request'})`);
            break;
        default:
            lines.push(`lmbridge: ${error.message} (JSON-RPC error ${error.code}${error.method ? ` on ${error.method}` : ''})`);
            if (error.data !== undefined) {
                lines.push(`Details: ${truncate(JSON.stringify(error.data), 2000)}`);
            }
    }
    return lines.join('\n');
}

function truncate(text: string, max: number): string {
    return text.length > max ? text.slice(0, max) + '…' : text;
}
