/**
 * Message conversion, the permission tool's confirmation, the manifest and the command line, without lmbridge.
 */

import './register';
import { strict as assert } from 'node:assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { test } from 'node:test';
import * as vscode from 'vscode';
import { commandLine, exitMessage } from '../src/bridge';
import { notificationText } from '../src/extension';
import { fromProtocolPart, promptTsxText, SYSTEM_ROLE, toProtocolMessage, toProtocolToolMode, toProtocolTools } from '../src/convert';
import { describeError } from '../src/errors';
import { confirmationMarkdown, PermissionTool } from '../src/permissionTool';
import { estimateTokens, usageText } from '../src/provider';
import { RpcError } from '../src/rpc';
import { PACKAGE_ROOT } from './helpers';

test('VS Code parts become protocol parts', () => {
    const image = new Uint8Array([0x89, 0x50, 0x4e, 0x47]);
    const messages = [
        new vscode.LanguageModelChatMessage(SYSTEM_ROLE as vscode.LanguageModelChatMessageRole, 'Be brief.'),
        vscode.LanguageModelChatMessage.User([new vscode.LanguageModelTextPart('look'), vscode.LanguageModelDataPart.image(image, 'image/png')], 'me'),
        vscode.LanguageModelChatMessage.Assistant([
            new vscode.LanguageModelTextPart('reading'),
            new vscode.LanguageModelToolCallPart('lmb_1', 'read_file', { path: 'README.md' }),
        ]),
        vscode.LanguageModelChatMessage.User([
            new vscode.LanguageModelToolResultPart('lmb_1', [
                new vscode.LanguageModelTextPart('# Title'),
                new vscode.LanguageModelPromptTsxPart({ node: { type: 1, children: [{ type: 2, text: 'from tsx' }] } }),
                vscode.LanguageModelDataPart.text('plain', 'text/plain'),
            ]),
        ]),
    ];
    assert.deepEqual(messages.map(m => toProtocolMessage(m as unknown as vscode.LanguageModelChatRequestMessage)), [
        { role: 'system', content: [{ type: 'text', value: 'Be brief.' }] },
        {
            role: 'user', name: 'me', content: [
                { type: 'text', value: 'look' },
                { type: 'data', mimeType: 'image/png', data: Buffer.from(image).toString('base64') },
            ],
        },
        {
            role: 'assistant', content: [
                { type: 'text', value: 'reading' },
                { type: 'tool_call', callId: 'lmb_1', name: 'read_file', input: { path: 'README.md' } },
            ],
        },
        {
            role: 'user', content: [{
                type: 'tool_result', callId: 'lmb_1', content: [
                    { type: 'text', value: '# Title' },
                    { type: 'text', value: 'from tsx' },
                    { type: 'data', mimeType: 'text/plain', data: Buffer.from('plain').toString('base64') },
                ],
            }],
        },
    ]);
});

test('parts made by another copy of the API classes convert by shape; thinking and unknown parts are left out', () => {
    class LanguageModelThinkingPart {
        constructor(public value: string) { }
    }
    const message = {
        role: vscode.LanguageModelChatMessageRole.Assistant,
        name: undefined,
        content: [
            new LanguageModelThinkingPart('hmm'),
            { value: 'text by shape' },
            { callId: 'c1', name: 'tool', input: { a: 1 } },
            { callId: 'c1', content: [{ value: 'result' }] },
            { something: 'unknown' },
        ],
    };
    assert.deepEqual(toProtocolMessage(message as unknown as vscode.LanguageModelChatRequestMessage), {
        role: 'assistant',
        content: [
            { type: 'text', value: 'text by shape' },
            { type: 'tool_call', callId: 'c1', name: 'tool', input: { a: 1 } },
            { type: 'tool_result', callId: 'c1', content: [{ type: 'text', value: 'result' }] },
        ],
    });
});

test('tools and tool mode', () => {
    assert.deepEqual(toProtocolTools([{ name: 't', description: 'd' }]), [{ name: 't', description: 'd', inputSchema: { type: 'object' } }]);
    assert.deepEqual(toProtocolTools(undefined), []);
    assert.equal(toProtocolToolMode(vscode.LanguageModelChatToolMode.Required), 'required');
    assert.equal(toProtocolToolMode(vscode.LanguageModelChatToolMode.Auto), 'auto');
});

test('protocol parts become VS Code response parts', () => {
    const text = fromProtocolPart({ type: 'text', value: 'hi' });
    assert.ok(text instanceof vscode.LanguageModelTextPart);
    assert.equal(text.value, 'hi');
    const call = fromProtocolPart({ type: 'tool_call', callId: 'lmb_2', name: 'x', input: '{"a":1}' });
    assert.ok(call instanceof vscode.LanguageModelToolCallPart);
    assert.deepEqual([call.callId, call.name, call.input], ['lmb_2', 'x', { a: 1 }]);
    const data = fromProtocolPart({ type: 'data', mimeType: 'image/png', data: Buffer.from('png').toString('base64') });
    assert.ok(data instanceof vscode.LanguageModelDataPart);
    assert.equal(Buffer.from(data.data).toString(), 'png');
    assert.equal(fromProtocolPart({ type: 'thinking', value: 'hmm' }), undefined, 'no thinking part class: dropped');
    class Thinking {
        constructor(public value: string | string[], public id?: string) { }
    }
    const thought = fromProtocolPart({ type: 'thinking', value: 'hmm', id: 't1' }, Thinking);
    assert.ok(thought instanceof Thinking);
    assert.deepEqual([thought.value, thought.id], ['hmm', 't1']);
    assert.equal(fromProtocolPart({ type: 'future_part' }), undefined);
    assert.equal(fromProtocolPart(null), undefined);
});

test('prompt-tsx text extraction', () => {
    assert.equal(promptTsxText({ node: { children: [{ text: 'a' }, { children: [{ text: 'b' }] }] } }), 'ab');
    assert.equal(promptTsxText({ x: 1 }), '{"x":1}');
});

test('the permission confirmation shows title, kind, command, paths and options, escaped', async () => {
    const input = {
        title: 'Run rm -rf build *now*',
        kind: 'execute',
        command: 'rm -rf build && echo ```done```',
        paths: ['/work/build', '/work/`odd` name'],
        options: [
            { optionId: 'allow-once', name: 'Allow once', kind: 'allow_once' },
            { optionId: 'reject-once', name: 'Reject', kind: 'reject_once' },
        ],
    };
    const prepared = await new PermissionTool().prepareInvocation({ input });
    assert.equal(prepared.confirmationMessages?.title, 'Allow the agent to run a command?');
    const markdown = (prepared.confirmationMessages?.message as vscode.MarkdownString).value;
    assert.equal(markdown, confirmationMarkdown(input));
    assert.match(markdown, /\*\*Run rm \\-rf build \\\*now\\\*\*\*/);
    assert.match(markdown, /Kind: `execute`/);
    assert.match(markdown, /````sh\nrm -rf build && echo ```done```\n````/);
    assert.match(markdown, /- `\/work\/build`/);
    assert.match(markdown, /- ``\/work\/`odd` name``/);
    assert.match(markdown, /Allow once \(`allow-once`\), Reject \(`reject-once`\)/);
    assert.match(String(prepared.invocationMessage), /Run rm -rf build/);
});

test('the permission tool answers allow', async () => {
    const result = await new PermissionTool().invoke();
    assert.ok(result instanceof vscode.LanguageModelToolResult);
    const [part] = result.content as vscode.LanguageModelTextPart[];
    assert.equal(part.value, 'allow');
});

test('the manifest contributes the provider, the permission tool and the settings', () => {
    const manifest = JSON.parse(fs.readFileSync(path.join(PACKAGE_ROOT, 'package.json'), 'utf8'));
    assert.deepEqual(manifest.contributes.languageModelChatProviders.map((p: { vendor: string }) => p.vendor), ['lmbridge']);
    const tool = manifest.contributes.languageModelTools.find((t: { name: string }) => t.name === 'acp_agent_action');
    assert.ok(tool, 'acp_agent_action is contributed');
    assert.deepEqual(tool.inputSchema.required, ['title', 'options']);
    // VS Code's agent mode offers only tools that can be referenced in a prompt (enabled by default).
    assert.equal(tool.canBeReferencedInPrompt, true);
    assert.match(tool.toolReferenceName, /^[\w-]+$/);
    for (const key of ['title', 'kind', 'command', 'paths', 'options']) {
        assert.ok(key in tool.inputSchema.properties, `inputSchema has ${key}`);
    }
    const settings = Object.keys(manifest.contributes.configuration.properties).sort();
    assert.deepEqual(settings, [
        'lmbridge.configFile', 'lmbridge.http', 'lmbridge.logLevel', 'lmbridge.path', 'lmbridge.shareEditorModels',
        'lmbridge.sharedModelFilter', 'lmbridge.traceDir',
    ]);
    for (const [name, version] of Object.entries({ ...manifest.dependencies, ...manifest.devDependencies })) {
        assert.match(String(version), /^\d+\.\d+\.\d+$/, `${name} is pinned to an exact version`);
    }
});

test('settings become the lmbridge command line', () => {
    assert.deepEqual(commandLine({ path: '', configFile: '', logLevel: 'info', traceDir: '' }),
        { command: 'lmbridge', args: ['stdio', '--log-level', 'info'] });
    assert.deepEqual(commandLine({ path: '~/bin/lmbridge', configFile: '/etc/a.toml', logLevel: 'debug', traceDir: '/tmp/t' }), {
        command: path.join(os.homedir(), 'bin/lmbridge'),
        args: ['stdio', '--config', '/etc/a.toml', '--log-level', 'debug', '--trace-dir', '/tmp/t'],
    });
});

test('errors read well', () => {
    const start = new RpcError(-32001, "agent 'ghost' failed to start: command not found", {
        agent: 'ghost', stderr: 'line 1\nline 2', exitCode: 127,
    });
    assert.equal(describeError(start),
        "agent 'ghost' failed to start: command not found (lmbridge error -32001)\nExit code: 127\nThe agent's stderr ended with:\nline 1\nline 2");
    assert.match(describeError(new RpcError(-32602, 'Invalid params: modelId: unknown model', { field: 'modelId' })),
        /refused the request: Invalid params: modelId: unknown model \(field modelId\) \(JSON-RPC error -32602\)/);
    assert.match(describeError(new RpcError(-32603, 'Internal error: KeyError')), /Internal error: KeyError \(JSON-RPC error -32603\)/);
});

test('the local token estimate matches lmbridge\'s', () => {
    assert.equal(estimateTokens('hello world!'), 3);
    assert.equal(estimateTokens('日本'), 2);
    assert.equal(estimateTokens(''), 0);
});

test('an error as a notification: one paragraph, the first line and the last ones', () => {
    assert.equal(notificationText('lmbridge could not start (status 2): configuration error: f.toml:3, key \'x\''),
        'lmbridge could not start (status 2): configuration error: f.toml:3, key \'x\'');
    const long = ['lmbridge exited (status 1):', ...Array.from({ length: 30 }, (_, i) => `  log line ${i}  `)].join('\n');
    assert.equal(notificationText(long),
        'lmbridge exited (status 1): … log line 25 log line 26 log line 27 log line 28 log line 29');
});

test('lmbridge\'s exit: a configuration error said plainly, anything else with its status and stderr', () => {
    const config = "lmbridge: configuration error: /c.toml:3, key 'agents.a.x': unknown key";
    assert.equal(exitMessage('lmbridge', 2, null, ['starting', config], `starting\n${config}`),
        "lmbridge could not start (status 2): configuration error: /c.toml:3, key 'agents.a.x': unknown key. " +
        'Fix the file (or the "lmbridge.configFile" setting); the next request starts lmbridge again.');
    assert.equal(exitMessage('/bin/lmbridge', null, 'SIGKILL', [], ''),
        'lmbridge (/bin/lmbridge) exited unexpectedly (signal SIGKILL), with nothing on stderr');
    assert.equal(exitMessage('lmbridge', 1, null, ['boom'], 'boom'), 'lmbridge (lmbridge) exited unexpectedly (status 1):\nboom');
});

test('a turn\'s usage for the log', () => {
    assert.equal(usageText(undefined), '');
    assert.equal(usageText({ inputTokens: 24, outputTokens: 14, contextUsed: 19000, contextSize: 200000,
        cost: { amount: 0.0525, currency: 'USD' } }), ' · 24 in / 14 out · context 19,000 of 200,000 (10%) · 0.0525 USD');
    assert.equal(usageText({ contextUsed: 5, contextSize: 0 }), '');
});

test('an agent\'s question is asked after Continue: a pick, a form as JSON, a page to open; Escape declines', async () => {
    const { fake } = await import('./fake-vscode');
    const ask = async (input: object) => {
        const result = await new PermissionTool().invoke({ input } as vscode.LanguageModelToolInvocationOptions<any>);
        return (result.content as vscode.LanguageModelTextPart[])[0].value;
    };
    fake.reset();
    const decline = { optionId: 'decline', name: 'Decline', kind: 'reject_once' };
    const colour = { title: 'Which colour?', kind: 'elicitation', details: { form: {} },
        options: [{ optionId: 'red', name: 'red', kind: 'allow_once' }, { optionId: 'green', name: 'green', kind: 'allow_once' }, decline] };
    fake.answers.push('green');
    assert.equal(await ask(colour), 'green');
    assert.deepEqual(fake.prompts, ['Which colour?: red | green']);
    const form = { title: 'Who are you?', kind: 'elicitation',
        details: { form: { properties: { name: { type: 'string' }, age: { type: 'integer', description: 'in years' }, ok: { type: 'boolean' } } } },
        options: [{ optionId: 'accept', name: 'Submit', kind: 'allow_once' }, decline] };
    fake.answers.push('Ada', '36', 'true');
    assert.deepEqual(JSON.parse(await ask(form)), { name: 'Ada', age: '36', ok: 'true' });
    assert.equal(fake.prompts[2], 'age (integer — in years)');
    fake.answers.push('Ada', undefined);
    assert.equal(await ask(form), 'decline');
    const visit = { title: 'Sign in', kind: 'elicitation', details: { url: 'https://example.com/login' },
        options: [{ optionId: 'accept', name: 'Done', kind: 'allow_once' }, decline] };
    assert.equal(await ask(visit), 'accept');
    assert.deepEqual(fake.opened, ['https://example.com/login']);
    assert.equal(await ask({ title: 'rm -rf build', kind: 'execute', options: [] }), 'allow');
});
