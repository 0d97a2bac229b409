/**
 * The editor's own models, shared with the real lmbridge (LMBRIDGE_BIN): the fake `vscode.lm` lists another vendor's
 * model and lmbridge's own; the demo agent asks through the `editor_model` tool (its `/ask` directive), and the
 * extension answers lmbridge's `editor/chat` with that model's `sendRequest` — streamed, cancellable, never with
 * lmbridge's own models.
 */

import './register';
import { strict as assert } from 'node:assert';
import { after, before, describe, test } from 'node:test';
import * as vscode from 'vscode';
import { chatOptions, Collector, demoModel, type Harness, requireLmbridge, startExtension } from './helpers';
import { fake, type FakeChatModel } from './fake-vscode';

const User = vscode.LanguageModelChatMessage.User;

/** A model of another vendor: answers "<id> heard: <last user text>" in words; "/wait" waits for the cancel. */
class ScriptedModel implements FakeChatModel {
    readonly requests: { messages: vscode.LanguageModelChatMessage[]; options: any }[] = [];
    cancelled = 0;
    name: string;
    family = 'scripted';
    version = '1';
    maxInputTokens = 8192;

    constructor(readonly id: string, readonly vendor: string) {
        this.name = `Scripted ${id}`;
    }

    async sendRequest(messages: vscode.LanguageModelChatMessage[], options: any, token: vscode.CancellationToken) {
        this.requests.push({ messages, options });
        const last = messages[messages.length - 1].content.map(p => (p as vscode.LanguageModelTextPart).value).join('');
        const model = this;
        async function* stream() {
            if (last === '/wait') {
                yield new vscode.LanguageModelTextPart('waiting');
                await new Promise<void>(resolve => token.onCancellationRequested(() => { model.cancelled++; resolve(); }));
                return;
            }
            for (const word of `${model.id} heard: ${last}`.split(' ')) {
                yield new vscode.LanguageModelTextPart(word + ' ');
            }
        }
        return { stream: stream() };
    }
}

function source(): vscode.CancellationTokenSource {
    return new vscode.CancellationTokenSource();
}

describe('the editor\'s models, shared with lmbridge', () => {
    let h: Harness;
    const shared = new ScriptedModel('gpt-test', 'copilot');
    const own = new ScriptedModel('own', 'lmbridge');

    before(() => {
        requireLmbridge();
        h = startExtension();
        fake.chatModels = [shared, own];
    });

    after(async () => {
        await h?.stop();
    });

    test('the agent asks a model of the editor and gets its streamed answer', async () => {
        const progress = new Collector();
        await h.provider.provideLanguageModelChatResponse(demoModel, [User('/ask model=gpt-test what is new?')], chatOptions(),
            progress, source().token);
        // Five parts; those that reach lmbridge together go on as one progress note: one note at least, five at most.
        const [, notes, rest] = /^editor model \((\d+) progress notes\): (.*)$/s.exec(progress.text()) ?? [];
        assert.equal(rest, 'gpt-test heard: what is new? \n');
        assert.ok(Number(notes) >= 1 && Number(notes) <= 5, progress.text());
        assert.equal(shared.requests.length, 1);
        const text = shared.requests[0].messages.map(m => m.content.map(p => (p as vscode.LanguageModelTextPart).value).join('')).join('|');
        assert.equal(text, 'what is new?');
        assert.match(shared.requests[0].options.justification, /lmbridge/);
    });

    test('lmbridge\'s own models are never shared back', async () => {
        const progress = new Collector();
        await h.provider.provideLanguageModelChatResponse(demoModel, [User('/ask model=own hello')], chatOptions(),
            progress, source().token);
        assert.match(progress.text(), /editor model failed[\s\S]*'own' is not one of \['gpt-test'\]/);
        assert.equal(own.requests.length, 0);
    });

    test('cancelling the turn cancels the model\'s request', async () => {
        const cancel = source();
        const progress = new Collector();
        const response = h.provider.provideLanguageModelChatResponse(demoModel, [User('/ask /wait')], chatOptions(),
            progress, cancel.token);
        while (shared.requests.length < 2) {
            await new Promise(resolve => setTimeout(resolve, 20)); // the model is asked by another process: polled
        }
        cancel.cancel();
        await response;
        const deadline = Date.now() + 60_000; // a bound only a lost cancel reaches
        while (shared.cancelled === 0 && Date.now() < deadline) {
            await new Promise(resolve => setTimeout(resolve, 20));
        }
        assert.equal(shared.cancelled, 1, 'the model\'s cancellation token fired');
    });

    test('a change of the models is shared at once', async () => {
        fake.chatModels = [shared, own, new ScriptedModel('claude-test', 'anthropic')];
        fake.fireModelsChanged();
        const deadline = Date.now() + 60_000;
        let text = '';
        while (!text.includes('claude-test heard') && Date.now() < deadline) {
            const progress = new Collector();
            await h.provider.provideLanguageModelChatResponse(demoModel, [User('/ask model=claude-test hi')], chatOptions(),
                progress, source().token);
            text = progress.text();
        }
        assert.match(text, /claude-test heard: hi/);
    });
});
