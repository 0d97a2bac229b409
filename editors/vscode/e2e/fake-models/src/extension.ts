/**
 * An extension of its own with a language model provider (vendor `e2e-fake`): the "editor's models" the lmbridge
 * extension shares with lmbridge in ../run.py's tests, installed as a `.vsix` beside it (a vendor must be contributed
 * in an installed extension's package.json). Each answers "<id> heard: <last user text>" word by word; "/wait" says
 * "waiting" and then waits for its cancellation token. What reached it is in its exports (`FakeModelsApi`).
 */

import * as vscode from 'vscode';

export const FAKE_VENDOR = 'e2e-fake';
export const FAKE_MODEL = 'e2e-scripted';
// A model with an agent-sized context window: an agent on the editor's models (Claude Code) thinks with it.
export const FAKE_LARGE_MODEL = 'e2e-large';

export const fakeModels = {
    requests: [] as string[],
    cancelled: 0,
};

function lastUserText(messages: readonly vscode.LanguageModelChatRequestMessage[]): string {
    const last = messages[messages.length - 1];
    return (last?.content ?? []).map(part => part instanceof vscode.LanguageModelTextPart ? part.value : '').join('');
}

const provider: vscode.LanguageModelChatProvider = {
    provideLanguageModelChatInformation() {
        return [{
            id: FAKE_MODEL, name: 'E2E scripted model', family: 'scripted', version: '1',
            maxInputTokens: 8192, maxOutputTokens: 1024, capabilities: { toolCalling: true },
        }, {
            id: FAKE_LARGE_MODEL, name: 'E2E scripted model (large)', family: 'scripted', version: '1',
            maxInputTokens: 200_000, maxOutputTokens: 32_000, capabilities: { toolCalling: true },
        }];
    },
    async provideLanguageModelChatResponse(model, messages, _options, progress, token) {
        const text = lastUserText(messages);
        fakeModels.requests.push(text);
        if (text === '/wait') {
            progress.report(new vscode.LanguageModelTextPart('waiting'));
            await new Promise<void>(resolve => {
                const subscription = token.onCancellationRequested(() => {
                    fakeModels.cancelled++;
                    subscription.dispose();
                    resolve();
                });
            });
            return;
        }
        for (const word of `${model.id} heard: ${text}`.split(' ')) {
            progress.report(new vscode.LanguageModelTextPart(word + ' '));
        }
    },
    provideTokenCount(_model, text) {
        return Promise.resolve(Math.ceil((typeof text === 'string' ? text : JSON.stringify(text)).length / 4));
    },
};

export interface FakeModelsApi {
    model: string;
    requests: string[];
    cancelled(): number;
}

export function activate(context: vscode.ExtensionContext): FakeModelsApi {
    context.subscriptions.push(vscode.lm.registerLanguageModelChatProvider(FAKE_VENDOR, provider));
    return { model: FAKE_MODEL, requests: fakeModels.requests, cancelled: () => fakeModels.cancelled };
}
