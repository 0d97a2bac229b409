/**
 * The JSON-RPC client on its own, against in-memory streams standing for the daemon.
 */

import './register';
import { strict as assert } from 'node:assert';
import { PassThrough } from 'node:stream';
import { test } from 'node:test';
import { ConnectionClosedError, JsonRpcClient, RpcError } from '../src/rpc';

function pair() {
    const fromServer = new PassThrough();
    const toServer = new PassThrough();
    const client = new JsonRpcClient(fromServer, toServer);
    const sent: any[] = [];
    const sentWaiters: (() => void)[] = [];
    let buffered = '';
    toServer.on('data', (chunk: Buffer) => {
        buffered += chunk.toString('utf8');
        let newline: number;
        while ((newline = buffered.indexOf('\n')) >= 0) {
            sent.push(JSON.parse(buffered.slice(0, newline)));
            buffered = buffered.slice(newline + 1);
            sentWaiters.shift()?.();
        }
    });
    /** The first message the client wrote. */
    const nextSent = () => new Promise<any>(resolve => {
        if (sent.length) {
            resolve(sent[0]);
        } else {
            sentWaiters.push(() => resolve(sent[0]));
        }
    });
    const reply = (message: object) => fromServer.write(JSON.stringify(message) + '\n');
    return { client, fromServer, toServer, sent, nextSent, reply };
}

test('requests get increasing ids and their results', async () => {
    const { client, sent, reply } = pair();
    const a = client.request('lm/models', {});
    const b = client.request('lm/countTokens', { modelId: 'demo', text: 'x' });
    assert.equal(b.id, a.id + 1);
    reply({ jsonrpc: '2.0', id: b.id, result: { count: 1 } });
    reply({ jsonrpc: '2.0', id: a.id, result: { models: [] } });
    assert.deepEqual(await a.result, { models: [] });
    assert.deepEqual(await b.result, { count: 1 });
    assert.deepEqual(sent.map(m => m.method), ['lm/models', 'lm/countTokens']);
    assert.equal(sent[0].jsonrpc, '2.0');
});

test('error objects become RpcError with code, message and data', async () => {
    const { client, reply } = pair();
    const request = client.request('lm/chat', {});
    reply({ jsonrpc: '2.0', id: request.id, error: { code: -32001, message: 'agent failed to start', data: { stderr: 'boom', exitCode: 1 } } });
    await assert.rejects(request.result, (error: RpcError) => {
        assert.ok(error instanceof RpcError);
        assert.equal(error.code, -32001);
        assert.equal(error.message, 'agent failed to start');
        assert.deepEqual(error.data, { stderr: 'boom', exitCode: 1 });
        assert.equal(error.method, 'lm/chat');
        return true;
    });
});

test('notifications carrying a requestId go to that request; others to handlers', async () => {
    const { client, reply } = pair();
    const parts: unknown[] = [];
    const other: unknown[] = [];
    const unrelated: unknown[] = [];
    client.onNotification('lm/part', (_method, params) => unrelated.push(params));
    const request = client.request('lm/chat', {}, (_method, params) => parts.push(params.part));
    const second = client.request('lm/chat', {}, (_method, params) => other.push(params.part));
    reply({ jsonrpc: '2.0', method: 'lm/part', params: { requestId: request.id, part: { type: 'text', value: 'a' } } });
    reply({ jsonrpc: '2.0', method: 'lm/part', params: { requestId: second.id, part: { type: 'text', value: 'b' } } });
    reply({ jsonrpc: '2.0', method: 'lm/part', params: { requestId: 999, part: { type: 'text', value: 'c' } } });
    reply({ jsonrpc: '2.0', id: request.id, result: { stopReason: 'end_turn' } });
    reply({ jsonrpc: '2.0', id: second.id, result: { stopReason: 'end_turn' } });
    await request.result;
    await second.result;
    assert.deepEqual(parts, [{ type: 'text', value: 'a' }]);
    assert.deepEqual(other, [{ type: 'text', value: 'b' }]);
    assert.deepEqual(unrelated, [{ requestId: 999, part: { type: 'text', value: 'c' } }]);
});

test('framing: messages split across chunks, several per chunk, multi-byte characters cut in two', async () => {
    const { client, fromServer } = pair();
    const parts: string[] = [];
    const request = client.request('lm/chat', {}, (_m, params) => parts.push(params.part.value));
    const lines = [
        { jsonrpc: '2.0', method: 'lm/part', params: { requestId: request.id, part: { type: 'text', value: 'héllo 🌍' } } },
        { jsonrpc: '2.0', method: 'lm/part', params: { requestId: request.id, part: { type: 'text', value: '日本語' } } },
        { jsonrpc: '2.0', id: request.id, result: { stopReason: 'end_turn' } },
    ].map(m => JSON.stringify(m) + '\n').join('');
    const bytes = Buffer.from(lines, 'utf8');
    // One byte at a time: every multi-byte character is split.
    for (let i = 0; i < bytes.length; i++) {
        fromServer.write(bytes.subarray(i, i + 1));
    }
    assert.deepEqual(await request.result, { stopReason: 'end_turn' });
    assert.deepEqual(parts, ['héllo 🌍', '日本語']);
});

test('a line that is not JSON is skipped; the connection carries on', async () => {
    const { client, fromServer, reply } = pair();
    const request = client.request('lm/models', {});
    fromServer.write('this is not json\n[1,2]\n\n');
    reply({ jsonrpc: '2.0', id: request.id, result: { models: [] } });
    assert.deepEqual(await request.result, { models: [] });
});

test('a request from the server is answered with method not found', async () => {
    const { reply, nextSent } = pair();
    reply({ jsonrpc: '2.0', id: 'srv-1', method: 'editor/doSomething', params: {} });
    const answer = await nextSent();
    assert.equal(answer.id, 'srv-1');
    assert.equal(answer.error.code, -32601);
});

test('a request from the server is answered by its handler: the result, an error, or aborted by its cancel', async () => {
    const { client, reply, sent } = pair();
    const answer = async (n: number) => {
        while (sent.length < n) {
            await new Promise(resolve => setImmediate(resolve));
        }
        return sent[n - 1];
    };
    let aborted = false;
    client.onRequest('editor/chat', async (params, signal) => {
        if (params.fail) {
            throw new RpcError(-32000, 'the model failed', { model: 'm' });
        }
        if (params.wait) {
            await new Promise<void>(resolve => signal.addEventListener('abort', () => { aborted = true; resolve(); }));
            return { stopReason: 'cancelled' };
        }
        return { stopReason: 'end_turn' };
    });
    reply({ jsonrpc: '2.0', id: 1, method: 'editor/chat', params: {} });
    assert.deepEqual(await answer(1), { jsonrpc: '2.0', id: 1, result: { stopReason: 'end_turn' } });
    reply({ jsonrpc: '2.0', id: 2, method: 'editor/chat', params: { fail: true } });
    assert.deepEqual((await answer(2)).error, { code: -32000, message: 'the model failed', data: { model: 'm' } });
    reply({ jsonrpc: '2.0', id: 'x', method: 'editor/chat', params: { wait: true } });
    reply({ jsonrpc: '2.0', method: '$/cancelRequest', params: { id: 'x' } });
    assert.deepEqual(await answer(3), { jsonrpc: '2.0', id: 'x', result: { stopReason: 'cancelled' } });
    assert.equal(aborted, true);
});

test('closing rejects pending requests and refuses new ones', async () => {
    const { client, fromServer } = pair();
    const request = client.request('lm/chat', {});
    fromServer.end();
    await assert.rejects(request.result, ConnectionClosedError);
    await assert.rejects(client.request('lm/models', {}).result, ConnectionClosedError);
    assert.equal(client.isClosed, true);
});

test('notify sends a notification without id', async () => {
    const { client, nextSent } = pair();
    client.notify('$/cancelRequest', { id: 7 });
    const message = await nextSent();
    assert.deepEqual(message.params, { id: 7 });
    assert.equal(message.method, '$/cancelRequest');
    assert.equal('id' in message, false);
});

test('a request whose write failed is marked undelivered (the server never saw it)', async () => {
    const fromServer = new PassThrough();
    const toServer = new PassThrough();
    const warnings: string[] = [];
    const client = new JsonRpcClient(fromServer, toServer, { trace: () => undefined, warn: m => warnings.push(m) });
    const delivered = client.request('lm/models', {});
    assert.equal(delivered.undelivered, false);
    toServer.destroy(); // the process is gone: what is written now fails
    const lost = client.request('lm/models', {});
    const failed = new Promise<void>(resolve => toServer.once('close', () => setImmediate(resolve)));
    await failed;
    assert.equal(lost.undelivered, true);
    assert.equal(delivered.undelivered, false);
    client.close(new ConnectionClosedError('gone'));
    await assert.rejects(lost.result, ConnectionClosedError);
    await assert.rejects(delivered.result, ConnectionClosedError);
});

test('a logger that throws does not stop a message from being written', async () => {
    const { nextSent, toServer } = pair();
    const client = new JsonRpcClient(new PassThrough(), toServer, {
        trace: () => { throw new Error('Channel has been closed'); }, warn: () => undefined,
    });
    assert.throws(() => client.request('shutdown', null), /Channel has been closed/);
    assert.equal((await nextSent()).method, 'shutdown');
});
