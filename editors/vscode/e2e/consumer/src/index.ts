/**
 * The lmbridge extension's integration tests, run inside a real VS Code's extension host by ../run.py. They use the
 * packaged `.vsix` as a user installed it, through `vscode.lm` as any other extension (Copilot Chat included) would,
 * with lmbridge's built-in demo agent behind it; its directives (`/say`, `/sleep`, `/tool`, ...) script each turn.
 */

import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import * as vscode from 'vscode';
import {
    alive, assert, assertIncludes, collect, type Collected, demoModel, lmbridgeApi, log, runAll, runState, saveRunState, test,
    until,
} from './harness';

const User = vscode.LanguageModelChatMessage.User;
const Assistant = vscode.LanguageModelChatMessage.Assistant;

const echoTool: vscode.LanguageModelChatTool = {
    name: 'e2e_echo',
    description: 'Echoes its text back.',
    inputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
};

function toolResult(call: vscode.LanguageModelToolCallPart, text: string): vscode.LanguageModelToolResultPart {
    return new vscode.LanguageModelToolResultPart(call.callId, [new vscode.LanguageModelTextPart(text)]);
}

async function lmbridgeSettingsChanged(change: () => Thenable<void>): Promise<void> {
    const changed = new Promise<void>(resolve => {
        const subscription = vscode.workspace.onDidChangeConfiguration(event => {
            if (event.affectsConfiguration('lmbridge')) {
                subscription.dispose();
                resolve();
            }
        });
    });
    await change();
    await changed;
}

function cmdline(pid: number): string[] {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
}

test('the models are listed with their metadata', async () => {
    const models = await vscode.lm.selectChatModels({ vendor: 'lmbridge' });
    const demo = models.find(m => m.id === 'demo');
    assert(demo, `the demo agent is a model; got ${JSON.stringify(models.map(m => m.id))}`);
    assert(demo.vendor === 'lmbridge', `vendor ${demo.vendor}`);
    assert(demo.name === 'lmbridge demo agent', `name ${demo.name}`);
    assert(demo.family === 'acp', `family ${demo.family}`);
    assert(demo.maxInputTokens === 200_000, `maxInputTokens ${demo.maxInputTokens}`);
    const tokens = await demo.countTokens('count these words please');
    assert(tokens > 0 && tokens < 20, `countTokens gave ${tokens}`);
});

test('an agent\'s own models appear after its first session, and modelOptions reach it', async () => {
    await collect(await demoModel(), [User('hi')]);
    let large: vscode.LanguageModelChat | undefined;
    await until(async () => {
        [large] = await vscode.lm.selectChatModels({ vendor: 'lmbridge', id: 'demo/demo-large' });
        return large !== undefined;
    }, 'VS Code lists demo/demo-large (lm/modelsChanged)');
    assert(large!.name === 'lmbridge demo agent: Demo Large', `name ${large!.name}`);
    const turn = await collect(large!, [User('/options')], { modelOptions: { effort: 'high', temperature: 0.3 } });
    assertIncludes(turn.text, 'options: effort="high" mode="code" model="demo-large"', 'the answer');
});

test('text streams while the agent produces it', async () => {
    // The agent says its early words, then waits ten minutes: the consumer can only see them before the end if they
    // were streamed. Seeing them, it cancels; a stream held back to the end would time the test out instead.
    const model = await demoModel();
    const source = new vscode.CancellationTokenSource();
    let seen = '';
    const turn = await collect(model, [User('/say early words\n/sleep 600000\n/say late words')], {}, source.token, part => {
        seen += part instanceof vscode.LanguageModelTextPart ? part.value : '';
        if (seen.includes('early words')) {
            source.cancel();
        }
    });
    assertIncludes(turn.text, 'early words', 'the answer');
    assert(!turn.text.includes('late words'), `the answer ended at the cancel: ${JSON.stringify(turn.text)}`);
});

test('a tool call goes to the consumer and its result back to the agent', async () => {
    const model = await demoModel();
    const prompt = User('/tool e2e_echo {"text": "ping"}');
    const first = await collect(model, [prompt], { tools: [echoTool] });
    assert(first.toolCalls.length === 1, `one tool call, got ${first.toolCalls.length}`);
    const call = first.toolCalls[0];
    assert(call.name === 'e2e_echo', `tool ${call.name}`);
    assert(JSON.stringify(call.input) === '{"text":"ping"}', `input ${JSON.stringify(call.input)}`);
    const second = await collect(model, [prompt, Assistant([call]), User([toolResult(call, 'pong from the consumer')])],
        { tools: [echoTool] });
    assertIncludes(second.text, 'pong from the consumer', 'the agent\'s answer');
});

test('two tool calls in one response, results returned in reverse order', async () => {
    const model = await demoModel();
    const prompt = User('/tools e2e_echo {"text": "left"} | e2e_echo {"text": "right"}');
    const first = await collect(model, [prompt], { tools: [echoTool] });
    const inputs = first.toolCalls.map(c => (c.input as { text: string }).text).sort();
    assert(JSON.stringify(inputs) === '["left","right"]', `two calls in one response, got ${JSON.stringify(inputs)}`);
    const results = [...first.toolCalls].reverse().map(c => toolResult(c, `result of ${(c.input as { text: string }).text}`));
    const second = await collect(model, [prompt, Assistant(first.toolCalls), User(results)], { tools: [echoTool] });
    assertIncludes(second.text, 'result of left', 'the agent\'s answer');
    assertIncludes(second.text, 'result of right', 'the agent\'s answer');
});

test('a permission request: the confirmation says what the agent wants, allowing continues the turn', async () => {
    const api = await lmbridgeApi();
    const info = vscode.lm.tools.find(t => t.name === 'acp_agent_action');
    assert(info, `the permission tool is registered; tools: ${vscode.lm.tools.map(t => t.name).join(', ')}`);
    const permissionTool: vscode.LanguageModelChatTool = {
        name: info.name, description: info.description, inputSchema: info.inputSchema,
    };
    const model = await demoModel();
    const prompt = User('/permission Delete the build folder');
    const first = await collect(model, [prompt], { tools: [permissionTool] });
    assert(first.toolCalls.length === 1 && first.toolCalls[0].name === 'acp_agent_action',
        `one acp_agent_action call, got ${JSON.stringify(first.toolCalls.map(c => c.name))}`);
    const call = first.toolCalls[0];
    const source = new vscode.CancellationTokenSource();
    const prepared = await api.permissionTool.prepareInvocation!({ input: call.input }, source.token);
    const confirmation = prepared?.confirmationMessages;
    assert(confirmation, 'the tool asks for confirmation');
    assert(confirmation.title === 'Allow the agent to run a command?', `title ${JSON.stringify(confirmation.title)}`);
    const message = typeof confirmation.message === 'string' ? confirmation.message : confirmation.message.value;
    assertIncludes(message, '**Delete the build folder**', 'the confirmation');
    assertIncludes(message, 'Kind: `execute`', 'the confirmation');
    assertIncludes(message, '(`allow-once`)', 'the confirmation');
    assertIncludes(message, 'Continue allows this once', 'the confirmation');
    // Outside a chat VS Code confirms by itself (tests never show dialogs): this is the Continue path.
    const result = await vscode.lm.invokeTool('acp_agent_action', { input: call.input, toolInvocationToken: undefined });
    const answer = result.content.map(p => p instanceof vscode.LanguageModelTextPart ? p.value : '').join('');
    assert(answer === 'allow', `the tool answers allow, got ${JSON.stringify(answer)}`);
    const second = await collect(model, [prompt, Assistant([call]), User([toolResult(call, answer)])],
        { tools: [permissionTool] });
    assertIncludes(second.text, 'allow', 'the agent\'s answer');
});

test('cancelling stops the response', async () => {
    // The agent would sleep ten minutes: the stream ends (well within the test's deadline) only if the cancel works.
    const model = await demoModel();
    const source = new vscode.CancellationTokenSource();
    let cancelledAt = 0;
    const turn = await collect(model, [User('/say started\n/sleep 600000\n/say never said')], {}, source.token, () => {
        if (!cancelledAt) {
            cancelledAt = Date.now();
            source.cancel();
        }
    });
    assert(cancelledAt > 0, 'a part arrived before the cancel');
    assert(!turn.text.includes('never said'), 'nothing after the cancel');
    log(`the stream ended ${turn.ended - cancelledAt} ms after the cancel (informational: make bench times cancels)`);
    const next = await collect(model, [User('/say after the cancel')]);
    assertIncludes(next.text, 'after the cancel', 'the next answer');
});

test('two concurrent requests run side by side and stay apart', async () => {
    // Each waits at the demo agent's barrier until the other got there: run one after the other, neither would end.
    const model = await demoModel();
    const [a, b] = await Promise.all([
        collect(model, [User('/say alpha starts\n/barrier e2e-pair 2\n/say alpha ends')]),
        collect(model, [User('/say beta starts\n/barrier e2e-pair 2\n/say beta ends')]),
    ]);
    assert(a.text.includes('alpha ends') && !a.text.includes('beta'), `first answer ${JSON.stringify(a.text)}`);
    assert(b.text.includes('beta ends') && !b.text.includes('alpha'), `second answer ${JSON.stringify(b.text)}`);
});

test('the agent\'s thoughts reach the consumer as thinking parts', async () => {
    const ThinkingPart = (vscode as unknown as { LanguageModelThinkingPart?: new (...args: never[]) => { value: string | string[] } })
        .LanguageModelThinkingPart;
    assert(ThinkingPart, 'this VS Code has LanguageModelThinkingPart');
    const model = await demoModel();
    const turn = await collect(model, [User('/think weighing the options\n/say decided')]);
    const thoughts = turn.parts.map(p => p.part).filter(p => p instanceof ThinkingPart)
        .map(p => { const v = (p as { value: string | string[] }).value; return Array.isArray(v) ? v.join('') : v; }).join('');
    assertIncludes(thoughts, 'weighing the options', 'the thinking parts');
    assertIncludes(turn.text, 'decided', 'the answer');
});

test('changing a setting starts lmbridge again with it', async () => {
    const api = await lmbridgeApi();
    const model = await demoModel();
    await collect(model, [User('/say before')]);
    const before = api.bridge.pid;
    assert(before && alive(before), 'an lmbridge is running');
    const config = vscode.workspace.getConfiguration('lmbridge');
    await lmbridgeSettingsChanged(() => config.update('logLevel', 'debug', vscode.ConfigurationTarget.Global));
    try {
        const turn = await collect(model, [User('/say after')]);
        assertIncludes(turn.text, 'after', 'the answer');
        const after = api.bridge.pid;
        assert(after && after !== before, `a new lmbridge (before ${before}, after ${after})`);
        const args = cmdline(after);
        assert(args[args.indexOf('--log-level') + 1] === 'debug', `started with --log-level debug: ${args.join(' ')}`);
        await until(() => !alive(before), `the old lmbridge (${before}) to stop`);
    } finally {
        await lmbridgeSettingsChanged(() => config.update('logLevel', undefined, vscode.ConfigurationTarget.Global));
    }
});

const KILL_ROUNDS = 20;

test(`lmbridge killed between requests: the next request works (${KILL_ROUNDS} rounds)`, async () => {
    // The request right after the kill meets an lmbridge whose exit the extension has not seen yet: its write may
    // fail, or land in the dead process's pipe. Either way it must be answered, by a new lmbridge.
    const api = await lmbridgeApi();
    const model = await demoModel();
    await collect(model, [User('/say before the kills')]);
    for (let round = 0; round < KILL_ROUNDS; round++) {
        const pid = api.bridge.pid;
        assert(pid, 'an lmbridge is running');
        runState.killed.push(pid);
        process.kill(pid, 'SIGKILL');
        // No await between the kill and the request. Three kinds of next request, in turn: a chat as a user sends
        // it (through vscode.lm), a chat straight to the extension's bridge, the model list.
        if (round % 3 === 0) {
            const turn = await collect(model, [User(`/say round ${round}`)]);
            assertIncludes(turn.text, `round ${round}`, `round ${round}'s answer`);
        } else if (round % 3 === 1) {
            const answer = await api.bridge.request<{ stopReason: string }>('lm/chat',
                { modelId: 'demo', messages: [{ role: 'user', content: [{ type: 'text', value: `/say round ${round}` }] }] });
            assert(answer.stopReason === 'end_turn', `round ${round}: ${JSON.stringify(answer)}`);
        } else {
            const models = await api.bridge.request<{ models: { id: string }[] }>('lm/models', {});
            assert(models.models.some(m => m.id === 'demo'), `lm/models after the kill: ${JSON.stringify(models)}`);
        }
        assert(api.bridge.pid !== pid, `round ${round}: a new lmbridge answered`);
    }
}, 240_000);

test('lmbridge killed mid-turn: the turn fails saying so, the next one works', async () => {
    const api = await lmbridgeApi();
    const model = await demoModel();
    let error: unknown;
    try {
        await collect(model, [User('/say working\n/sleep 20000')], {}, undefined, () => {
            const pid = api.bridge.pid!;
            runState.killed.push(pid);
            process.kill(pid, 'SIGKILL');
        });
    } catch (caught) {
        error = caught;
    }
    assert(error instanceof Error, 'the interrupted turn fails');
    assertIncludes(error.message, 'exited unexpectedly', 'the error');
    const turn = await collect(model, [User('/say recovered')]);
    assertIncludes(turn.text, 'recovered', 'the next answer');
});

test('a broken configuration: the models stay, requests and a notification give the full reason', async () => {
    const runDir = process.env.LMBRIDGE_E2E_RUN!;
    const broken = path.join(runDir, 'broken.toml');
    fs.writeFileSync(broken, '[agents.mine]\ncommand = "mine-agent"\nunknown_setting = 1\n');
    const config = vscode.workspace.getConfiguration('lmbridge');
    await lmbridgeSettingsChanged(() => config.update('configFile', broken, vscode.ConfigurationTarget.Global));
    try {
        const models = await vscode.lm.selectChatModels({ vendor: 'lmbridge' });
        assert(models.length > 0, 'lmbridge still offers a model');
        let error: unknown;
        try {
            await collect(models[0], [User('/say hello')]);
        } catch (caught) {
            error = caught;
        }
        assert(error instanceof Error, 'the request fails');
        log(`the request's error: ${error.message}`);
        assertIncludes(error.message, broken, 'the error');
        assertIncludes(error.message, 'unknown_setting', 'the error');
        runState.notifications.push({ includes: [broken, 'unknown_setting'], buttons: ['Show log', 'Open settings'] });
    } finally {
        await lmbridgeSettingsChanged(() => config.update('configFile', undefined, vscode.ConfigurationTarget.Global));
    }
    const turn = await collect(await demoModel(), [User('/say config fixed')]);
    assertIncludes(turn.text, 'config fixed', 'the answer once the setting is back');
}, 60_000);

test('the add-agent command writes a registry agent into the config file, and it becomes a model', async () => {
    const config = vscode.workspace.getConfiguration('lmbridge');
    const file = path.join(process.env.LMBRIDGE_E2E_RUN!, 'added.toml');
    await lmbridgeSettingsChanged(() => config.update('configFile', file, vscode.ConfigurationTarget.Global));
    try {
        // The id as an argument: what another extension or a keybinding passes (a person picks from the list).
        const added = await vscode.commands.executeCommand('lmbridge.addAgent', 'cline');
        assert(added === 'cline', `the command added ${JSON.stringify(added)}`);
        const written = fs.readFileSync(file, 'utf8');
        assertIncludes(written, '[agents.cline]', 'the config file');
        assertIncludes(written, 'command = "npx"', 'the config file');
        await until(async () => (await vscode.lm.selectChatModels({ vendor: 'lmbridge' })).some(m => m.id === 'cline'),
            'the added agent among lmbridge\'s models');
        runState.notifications.push({ includes: ['added [agents.cline] to', file], buttons: [] });
        const again = await vscode.commands.executeCommand('lmbridge.addAgent', 'cline');
        assert(again === undefined, 'adding it twice is refused');
        runState.notifications.push({ includes: ['could not add the agent', 'already has [agents.cline]'], buttons: [] });
        assert(fs.readFileSync(file, 'utf8') === written, 'the refused add left the file as it was');
    } finally {
        await lmbridgeSettingsChanged(() => config.update('configFile', undefined, vscode.ConfigurationTarget.Global));
    }
}, 60_000);

// -- the editor's own models, shared with lmbridge (docs/editor-models.md) -----------------------------------------

/** The fake vendor's extension (../fake-models), installed beside lmbridge's: its model and what reached it. */
interface FakeModelsApi {
    model: string;
    requests: string[];
    cancelled(): number;
}

async function fakeModels(): Promise<FakeModelsApi> {
    const extension = vscode.extensions.getExtension<FakeModelsApi>('lmbridge.lmbridge-e2e-fake-models');
    assert(extension, 'the fake model vendor\'s extension is installed');
    return extension.activate();
}

test('an agent asks a model of the editor (another extension\'s) and gets its answer, streamed', async () => {
    const fake = await fakeModels();
    // Shared once VS Code lists the vendor's model (its extension activates on the first listing): until then, the
    // agent's tool does not name it.
    let turn: Collected | undefined;
    await until(async () => {
        turn = await collect(await demoModel(), [User(`/ask model=${fake.model} what is shared?`)]);
        return !turn.text.includes('failed');
    }, 'the model to be shared', 30_000);
    assertIncludes(turn!.text, ` progress notes): ${fake.model} heard: what is shared?`, 'the agent\'s answer');
    // Five parts; those that reach lmbridge together go on as one progress note: one note at least, five at most.
    const notes = Number(/editor model \((\d+) progress notes\)/.exec(turn!.text)?.[1]);
    assert(notes >= 1 && notes <= 5, `progress notes: ${turn!.text}`);
    assert(fake.requests.includes('what is shared?'), `the provider was asked: ${JSON.stringify(fake.requests)}`);
});

test('lmbridge\'s own models are not shared back', async () => {
    const turn = await collect(await demoModel(), [User('/ask model=demo hello')]);
    assertIncludes(turn.text, 'editor model failed', 'the agent\'s answer');
    assertIncludes(turn.text, `'demo' is not one of`, 'the agent\'s answer');
});

test('cancelling the chat cancels the editor model\'s request, down to its provider\'s token', async () => {
    const fake = await fakeModels();
    const source = new vscode.CancellationTokenSource();
    const asked = fake.requests.length;
    const pending = collect(await demoModel(), [User(`/ask model=${fake.model} /wait`)], {}, source.token);
    await until(() => fake.requests.length > asked, 'the provider to be asked', 30_000);
    source.cancel();
    await pending.catch(() => undefined);
    await until(() => fake.cancelled() > 0, 'the provider\'s token to be cancelled', 30_000);
});

test('an agent on the editor\'s models: Claude Code answers with the other extension\'s model', async () => {
    const agents = process.env.LMBRIDGE_E2E_AGENT_ON_EDITOR;
    assert(agents, 'Claude Code is not installed for this run: `make interop` (or `make test`) installs it first');
    const fake = await fakeModels();
    const config = vscode.workspace.getConfiguration('lmbridge');
    await lmbridgeSettingsChanged(() => config.update('configFile', agents, vscode.ConfigurationTarget.Global));
    try {
        // The picker offers the agent on each model the editor shares ("agent@model"), beside the agent itself.
        let claude: vscode.LanguageModelChat | undefined;
        await until(async () => {
            [claude] = await vscode.lm.selectChatModels({ vendor: 'lmbridge', id: 'claude-on-editor@e2e-large' });
            return claude !== undefined;
        }, 'VS Code to list claude-on-editor@e2e-large', 60_000);
        assert(claude!.name === 'Claude Code on E2E scripted model (large)', claude!.name);
        const listed = (await vscode.lm.selectChatModels({ vendor: 'lmbridge' })).map(m => m.id);
        assert(listed.includes('claude-on-editor') && listed.includes('claude-on-editor@e2e-scripted'),
            `the models: ${JSON.stringify(listed)}`);
        const asked = fake.requests.length;
        let turn: Collected | undefined;
        let attempt = 0;
        // The provider is shared a moment after lmbridge starts (editor/modelsChanged): until then the agent's model
        // request is refused saying the editor shares no such model. Each attempt is a conversation of its own.
        await until(async () => {
            attempt++;
            turn = await collect(claude!, [User(`hello from the e2e run, attempt ${attempt}`)]);
            log(`attempt ${attempt}: ${turn.text.slice(0, 200)}`);
            return turn.text.includes('e2e-large heard:');
        }, 'an answer from the editor\'s model', 90_000);
        assertIncludes(turn!.text, `hello from the e2e run, attempt ${attempt}`, 'the answer (the provider echoes it)');
        assert(fake.requests.length > asked, 'the fake vendor\'s provider was asked');
    } finally {
        await lmbridgeSettingsChanged(() => config.update('configFile', undefined, vscode.ConfigurationTarget.Global));
    }
}, 240_000);

test('an HTTP client of the same lmbridge uses the shared model as editor/<id>', async () => {
    const fake = await fakeModels();
    const port = await freePort();
    const config = vscode.workspace.getConfiguration('lmbridge');
    await lmbridgeSettingsChanged(() => config.update('http', `127.0.0.1:${port}`, vscode.ConfigurationTarget.Global));
    try {
        await collect(await demoModel(), [User('/say started with --http')]); // the next request starts lmbridge with it
        const state = process.env.XDG_STATE_HOME || path.join(os.homedir(), '.local', 'state');
        const token = fs.readFileSync(path.join(state, 'lmbridge', 'token'), 'utf8').trim();
        let answer: any;
        await until(async () => {
            try {
                const response = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
                    method: 'POST',
                    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
                    body: JSON.stringify({ model: `editor/${fake.model}`, messages: [{ role: 'user', content: 'over http' }] }),
                });
                answer = await response.json();
                return response.status === 200;
            } catch {
                return false; // not listening yet
            }
        }, 'the HTTP API to answer', 30_000);
        assert(answer.choices[0].message.content === `${fake.model} heard: over http `, `the answer: ${JSON.stringify(answer)}`);
    } finally {
        await lmbridgeSettingsChanged(() => config.update('http', undefined, vscode.ConfigurationTarget.Global));
    }
}, 60_000);

function freePort(): Promise<number> {
    return new Promise((resolve, reject) => {
        const server = net.createServer();
        server.once('error', reject);
        server.listen(0, '127.0.0.1', () => {
            const { port } = server.address() as net.AddressInfo;
            server.close(() => resolve(port));
        });
    });
}

export async function run(): Promise<void> {
    try {
        await runAll();
    } finally {
        saveRunState();
        // The notification center stays open after the extension host has gone: run.py reads it there.
        await vscode.commands.executeCommand('notifications.showList');
    }
}
