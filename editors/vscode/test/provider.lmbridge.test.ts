/**
 * The provider, activated through the extension's activate() against the fake `vscode`, driving the real
 * `lmbridge stdio` (LMBRIDGE_BIN, default ../../.venv/bin/lmbridge) and its built-in demo agent.
 */

import './register';
import { strict as assert } from 'node:assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import * as vscode from 'vscode';
import {
    chatOptions, Collector, demoModel, type Harness, LMBRIDGE_BIN, permissionToolForModel, requireLmbridge, startExtension, tempDir,
} from './helpers';
import { UNAVAILABLE_MODEL_ID } from '../src/provider';


const User = vscode.LanguageModelChatMessage.User;

/** The agents' own entries (an agent's models, `agent/model`, follow once a session of it has shown them). */
function agentIds(models: vscode.LanguageModelChatInformation[]): string[] {
    return models.map(m => m.id).filter(id => !id.includes('/')).sort();
}

function source(): vscode.CancellationTokenSource {
    return new vscode.CancellationTokenSource();
}

describe('with lmbridge and the demo agent', () => {
    let h: Harness;

    before(() => {
        requireLmbridge();
        h = startExtension();
    });

    after(async () => {
        await h?.stop();
    });

    test('lists the demo agent as a model', async () => {
        const models = await h.provider.provideLanguageModelChatInformation({ silent: true }, source().token);
        const demo = models.find(m => m.id === 'demo');
        assert.ok(demo, `no demo model in ${JSON.stringify(models)}`);
        assert.equal(demo.family, 'acp');
        assert.equal(demo.capabilities.toolCalling, true);
        assert.ok(demo.maxInputTokens > 0 && demo.maxOutputTokens > 0);
    });

    test('an agent\'s own models are listed once it showed them, and modelOptions reach it', async () => {
        const changed = new Promise<void>(resolve => {
            const subscription = h.provider.onDidChangeLanguageModelChatInformation(() => { subscription.dispose(); resolve(); });
        });
        await h.provider.provideLanguageModelChatResponse(demoModel, [User('hi')], chatOptions(), new Collector(), source().token);
        await changed; // lm/modelsChanged: the demo agent's first session showed its models, options and commands
        const models = await h.provider.provideLanguageModelChatInformation({ silent: true }, source().token);
        const large = models.find(m => m.id === 'demo/demo-large');
        assert.ok(large, `no demo/demo-large in ${JSON.stringify(models.map(m => m.id))}`);
        assert.equal(large.name, 'lmbridge demo agent: Demo Large');
        assert.match(large.tooltip ?? '', /commands: \/say /);
        const progress = new Collector();
        const options = { ...chatOptions(), modelOptions: { effort: 'high', temperature: 0.3, unrelated: 'x' } };
        await h.provider.provideLanguageModelChatResponse(large, [User('/options')], options, progress, source().token);
        assert.equal(progress.text(), 'options: effort="high" mode="code" model="demo-large" verbose=false\n');
    });

    test('the contributed permission tool is the one lmbridge announces', () => {
        const announced = h.api.bridge.permissionTool;
        const contributed = permissionToolForModel();
        assert.ok(announced, 'initialize announced a permission tool');
        assert.equal(announced.name, contributed.name);
        assert.deepEqual(announced.inputSchema, contributed.inputSchema);
        assert.equal(announced.description, contributed.description);
    });

    test('counts tokens through lm/countTokens', async () => {
        assert.equal(await h.provider.provideTokenCount(demoModel, 'hello world!', source().token), 3);
        const count = await h.provider.provideTokenCount(demoModel, User('hello world!'), source().token);
        assert.equal(count, 3 + 4, 'a message is its text plus 4 for the framing');
    });

    test('a text turn: /say hello', async () => {
        const progress = new Collector();
        const turn = h.nextTurn();
        await h.provider.provideLanguageModelChatResponse(demoModel, [User('/say hello')], chatOptions(), progress, source().token);
        assert.equal(progress.text().trim(), 'hello');
        assert.equal((await turn).stopReason, 'end_turn');
        assert.ok(progress.parts.every(p => p instanceof vscode.LanguageModelTextPart));
    });

    test('cancellation: /stream 3 then /sleep 600000, cancelled after the first part, ends', async () => {
        // The agent would sleep ten minutes: the response ends within the test's deadline only through the cancel.
        const progress = new Collector();
        const cancel = source();
        const turn = h.nextTurn();
        const response = h.provider.provideLanguageModelChatResponse(demoModel, [User('/stream 3\n/sleep 600000')], chatOptions(),
            progress, cancel.token);
        await progress.waitForParts(1);
        cancel.cancel();
        await response;
        const record = await turn;
        assert.equal(record.answered, true, 'lmbridge answered the cancelled request');
        assert.equal(record.stopReason, 'cancelled');
        const partsAtCancel = progress.parts.length;
        assert.ok(partsAtCancel >= 1);

        // The daemon is fine afterwards.
        const next = new Collector();
        await h.provider.provideLanguageModelChatResponse(demoModel, [User('/say still here')], chatOptions(), next, source().token);
        assert.equal(next.text().trim(), 'still here');
        assert.equal(progress.parts.length, partsAtCancel, 'nothing was reported after the cancellation');
    });

    test('an unknown model is a readable error', async () => {
        const ghost = { ...demoModel, id: 'no-such-agent' } as vscode.LanguageModelChatInformation;
        await assert.rejects(
            h.provider.provideLanguageModelChatResponse(ghost, [User('hi')], chatOptions(), new Collector(), source().token),
            (error: Error) => {
                assert.match(error.message, /no-such-agent/);
                assert.match(error.message, /-32602/);
                assert.match(error.message, /modelId/);
                return true;
            });
    });

    test('lmbridge restarted after it died', async () => {
        const pid = h.api.bridge.pid;
        assert.ok(pid, 'lmbridge is running');
        const gone = h.api.bridge.currentClosed;
        assert.ok(gone);
        process.kill(pid, 'SIGKILL');
        await gone;
        const progress = new Collector();
        await h.provider.provideLanguageModelChatResponse(demoModel, [User('/say back again')], chatOptions(), progress, source().token);
        assert.equal(progress.text().trim(), 'back again');
        assert.notEqual(h.api.bridge.pid, pid);
        assert.ok(h.turns.length > 0);
    });

    test('lmbridge killed just before a chat: the chat is answered by a new lmbridge', async () => {
        for (let round = 0; round < 5; round++) {
            const pid = h.api.bridge.pid;
            assert.ok(pid, 'lmbridge is running');
            process.kill(pid, 'SIGKILL'); // no await: the extension has not seen the exit when the chat is written
            const progress = new Collector();
            await h.provider.provideLanguageModelChatResponse(demoModel, [User(`/say round ${round}`)], chatOptions(), progress,
                source().token);
            assert.equal(progress.text().trim(), `round ${round}`);
            assert.notEqual(h.api.bridge.pid, pid);
        }
    });

    test('a tool round trip: /tool get_weather', async () => {
        const weather: vscode.LanguageModelChatTool = {
            name: 'get_weather', description: 'The weather in a city',
            inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
        };
        const first = User('/tool get_weather {"city":"Paris"}');
        const progress = new Collector();
        const turn = h.nextTurn();
        await h.provider.provideLanguageModelChatResponse(demoModel, [first], chatOptions([weather]), progress, source().token);
        const record = await turn;
        const calls = progress.toolCalls();
        assert.equal(calls.length, 1, `expected one tool call, got parts ${JSON.stringify(progress.parts)} (${JSON.stringify(record)})`);
        assert.equal(calls[0].name, 'get_weather');
        assert.deepEqual(calls[0].input, { city: 'Paris' });
        assert.equal(record.stopReason, 'tool_calls');

        const second = new Collector();
        const history = [
            first,
            progress.asAssistantMessage(),
            User([new vscode.LanguageModelToolResultPart(calls[0].callId, [new vscode.LanguageModelTextPart('sunny, 21 °C')])]),
        ];
        await h.provider.provideLanguageModelChatResponse(demoModel, history, chatOptions([weather]), second, source().token);
        assert.match(second.text(), /tool get_weather returned: .*sunny, 21 °C/);
    });

    test('a permission round trip: /permission Delete build dir, answered allow', async () => {
        const tools = [permissionToolForModel()];
        const first = User('/permission Delete build dir');
        const progress = new Collector();
        const turn = h.nextTurn();
        await h.provider.provideLanguageModelChatResponse(demoModel, [first], chatOptions(tools), progress, source().token);
        const record = await turn;
        const calls = progress.toolCalls();
        assert.equal(calls.length, 1, `expected one tool call, got parts ${JSON.stringify(progress.parts)} (${JSON.stringify(record)})`);
        assert.equal(calls[0].name, 'acp_agent_action');
        const input = calls[0].input as { title: string; options: { optionId: string }[] };
        assert.match(input.title, /Delete build dir/);

        // What VS Code does: the confirmation from prepareInvocation, then (the user pressed Continue) invoke.
        const prepared = await h.tool.prepareInvocation({ input } as vscode.LanguageModelToolInvocationPrepareOptions<never>);
        const message = prepared.confirmationMessages!.message as vscode.MarkdownString;
        assert.match(message.value, /Delete build dir/);
        const result = await h.tool.invoke();
        const answer = result.content as vscode.LanguageModelTextPart[];
        assert.equal(answer[0].value, 'allow');

        const second = new Collector();
        const history = [first, progress.asAssistantMessage(), User([new vscode.LanguageModelToolResultPart(calls[0].callId, answer)])];
        await h.provider.provideLanguageModelChatResponse(demoModel, history, chatOptions(tools), second, source().token);
        assert.match(second.text(), /permission outcome: allow-once/);
    });

    test('a permission the user skipped: VS Code\'s skip text rejects', async () => {
        const tools = [permissionToolForModel()];
        const first = User('/permission Format the disk');
        const progress = new Collector();
        await h.provider.provideLanguageModelChatResponse(demoModel, [first], chatOptions(tools), progress, source().token);
        const [call] = progress.toolCalls();
        assert.ok(call, `expected a tool call, got ${JSON.stringify(progress.parts)}`);
        const skipped = [new vscode.LanguageModelTextPart('The user chose to skip the tool call, they want to proceed without running it')];
        const second = new Collector();
        const history = [first, progress.asAssistantMessage(), User([new vscode.LanguageModelToolResultPart(call.callId, skipped)])];
        await h.provider.provideLanguageModelChatResponse(demoModel, history, chatOptions(tools), second, source().token);
        assert.match(second.text(), /permission outcome: reject-once/);
    });

    test('a turn that stops early says why; an empty turn is never silent', async () => {
        const limited = new Collector();
        await h.provider.provideLanguageModelChatResponse(demoModel, [User('/say partial\n/stop max_tokens')], chatOptions(), limited,
            source().token);
        assert.match(limited.text(), /^partial\n[\s\S]*output token limit \(max_tokens\)/);
        const empty = new Collector();
        await h.provider.provideLanguageModelChatResponse(demoModel, [User('/stop end_turn')], chatOptions(), empty, source().token);
        assert.match(empty.text(), /ended its turn without a message/);
    });

    test('an agent that crashes mid-turn: -32002, and the next turn works', async () => {
        const progress = new Collector();
        await assert.rejects(
            h.provider.provideLanguageModelChatResponse(demoModel, [User('/say going down\n/crash')], chatOptions(), progress, source().token),
            (error: Error) => {
                assert.match(error.message, /-32002/);
                assert.match(error.message, /demo/);
                return true;
            });
        const next = new Collector();
        await h.provider.provideLanguageModelChatResponse(demoModel, [User('/say recovered')], chatOptions(), next, source().token);
        assert.equal(next.text().trim(), 'recovered');
    });
});

describe('errors surface readably', () => {
    before(requireLmbridge);

    test('an agent whose command does not exist: -32001 with the reason', async () => {
        const dir = tempDir('config');
        const config = path.join(dir, 'agents.toml');
        fs.writeFileSync(config, '[agents.ghost]\nname = "Ghost agent"\ncommand = "/nonexistent/ghost-acp-agent"\n');
        const h = startExtension({ configFile: config });
        try {
            const models = await h.provider.provideLanguageModelChatInformation({ silent: false }, source().token);
            assert.deepEqual(agentIds(models), ['demo', 'ghost']);
            const ghost = models.find(m => m.id === 'ghost')!;
            assert.equal(ghost.name, 'Ghost agent');
            await assert.rejects(
                h.provider.provideLanguageModelChatResponse(ghost, [User('hello')], chatOptions(), new Collector(), source().token),
                (error: Error) => {
                    assert.match(error.message, /-32001/);
                    assert.match(error.message, /ghost/);
                    assert.match(error.message, /ghost-acp-agent|not found|No such file/i);
                    assert.doesNotMatch(error.message, /no response/i);
                    return true;
                });
        } finally {
            await h.stop();
        }
    });

    test('an agent that exits at once: its stderr is shown', async () => {
        const dir = tempDir('config');
        const script = path.join(dir, 'broken-agent.sh');
        fs.writeFileSync(script, '#!/bin/sh\necho "broken-agent: missing API key ANTHROPIC_API_KEY" >&2\nexit 3\n', { mode: 0o755 });
        const config = path.join(dir, 'agents.toml');
        fs.writeFileSync(config, `[agents.broken]\ncommand = "${script}"\n`);
        const h = startExtension({ configFile: config });
        try {
            const broken = { ...demoModel, id: 'broken' } as vscode.LanguageModelChatInformation;
            await assert.rejects(
                h.provider.provideLanguageModelChatResponse(broken, [User('hello')], chatOptions(), new Collector(), source().token),
                (error: Error) => {
                    assert.match(error.message, /-32001/);
                    assert.match(error.message, /missing API key ANTHROPIC_API_KEY/);
                    return true;
                });
        } finally {
            await h.stop();
        }
    });

    /** The listing when lmbridge cannot start: one placeholder model, whose requests answer with the reason. */
    async function unavailable(h: Harness): Promise<{ notified: string; requestError: string }> {
        const models = await h.provider.provideLanguageModelChatInformation({ silent: false }, source().token);
        assert.deepEqual(models.map(m => m.id), [UNAVAILABLE_MODEL_ID], 'a placeholder model stays listed');
        const { fake } = await import('./fake-vscode');
        assert.equal(fake.errorMessages.length, 1, 'the user is told once');
        let requestError = '';
        await assert.rejects(h.provider.provideLanguageModelChatResponse(models[0], [User('hello')], chatOptions(),
            new Collector(), source().token), (error: Error) => { requestError = error.message; return true; });
        return { notified: fake.errorMessages[0], requestError };
    }

    test('lmbridge.path that does not exist: the placeholder model says so', async () => {
        const h = startExtension({ path: '/nonexistent/bin/lmbridge' });
        try {
            const { notified, requestError } = await unavailable(h);
            for (const message of [notified, requestError]) {
                assert.match(message, /\/nonexistent\/bin\/lmbridge/);
                assert.match(message, /not found/);
                assert.match(message, /lmbridge\.path/);
            }
        } finally {
            await h.stop();
        }
    });

    test('a configuration error: the whole reason is in the notification and the chat', async () => {
        const dir = tempDir('config');
        const config = path.join(dir, 'agents.toml');
        fs.writeFileSync(config, '[agents.claude]\ncommand = "npx"\nargs = "not a list"\n');
        const h = startExtension({ configFile: config });
        try {
            const { notified, requestError } = await unavailable(h);
            for (const message of [notified, requestError]) {
                assert.match(message, /could not start \(status 2\): configuration error/);
                assert.ok(message.includes(`${config}:3, key 'agents.claude.args'`), message);
            }
        } finally {
            await h.stop();
        }
    });

    test('changing the settings restarts lmbridge with them', async () => {
        const h = startExtension();
        try {
            const before = await h.provider.provideLanguageModelChatInformation({ silent: true }, source().token);
            assert.deepEqual(agentIds(before), ['demo']);
            const firstPid = h.api.bridge.pid;
            const dir = tempDir('config');
            const config = path.join(dir, 'agents.toml');
            fs.writeFileSync(config, '[agents.other]\ncommand = "/bin/false"\n');
            const refreshed = new Promise<void>(resolve => h.provider.onDidChangeLanguageModelChatInformation(() => resolve()));
            const { fake } = await import('./fake-vscode');
            fake.configure({ configFile: config });
            await refreshed;
            const afterChange = await h.provider.provideLanguageModelChatInformation({ silent: true }, source().token);
            assert.deepEqual(agentIds(afterChange), ['demo', 'other']);
            assert.notEqual(h.api.bridge.pid, firstPid);

            // A change while lmbridge is starting: the request is answered by one started with the new settings.
            await h.api.bridge.restart();
            const listing = h.provider.provideLanguageModelChatInformation({ silent: true }, source().token);
            fake.configure({ configFile: '' });
            assert.deepEqual(agentIds(await listing), ['demo']);
        } finally {
            await h.stop();
        }
    });
});

describe('thinking, where VS Code has LanguageModelThinkingPart', () => {
    class LanguageModelThinkingPart {
        constructor(public value: string | string[], public id?: string) { }
    }

    test('/think is reported as a thinking part', async () => {
        requireLmbridge();
        const h = startExtension({}, { thinkingPart: LanguageModelThinkingPart });
        try {
            const progress = new Collector();
            await h.provider.provideLanguageModelChatResponse(demoModel, [User('/think pondering\n/say done')], chatOptions(), progress,
                source().token);
            const thoughts = progress.parts.filter(p => p instanceof LanguageModelThinkingPart) as LanguageModelThinkingPart[];
            assert.match(thoughts.map(t => t.value).join(''), /pondering/);
            assert.equal(progress.text().trim(), 'done');
        } finally {
            await h.stop();
        }
    });
});

test('deactivate stops lmbridge', async () => {
    requireLmbridge();
    const h = startExtension();
    await h.provider.provideLanguageModelChatInformation({ silent: true }, source().token);
    const pid = h.api.bridge.pid!;
    const closed = h.api.bridge.currentClosed!;
    await h.stop();
    await closed;
    assert.throws(() => process.kill(pid, 0), /ESRCH/);
});

test('LMBRIDGE_BIN points at an lmbridge', () => {
    requireLmbridge();
    assert.ok(fs.statSync(LMBRIDGE_BIN).isFile());
});
