/**
 * The "Add an agent from the ACP registry" command, against the fake `vscode` and the real `lmbridge agents` CLI
 * (LMBRIDGE_BIN): the registry's list picked from, the table written into the config file the extension runs
 * lmbridge with, lmbridge started again with the new agent as a model; every failure a notification that says why,
 * with the file untouched.
 */

import './register';
import { strict as assert } from 'node:assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, beforeEach, describe, test } from 'node:test';
import * as vscode from 'vscode';
import {
    ADD_AGENT_COMMAND, AgentsCliError, agentsCommandLine, parseListing, pickItems, type RegistryAgent,
} from '../src/addAgent';
import { UNAVAILABLE_MODEL_ID } from '../src/provider';
import { type Harness, requireLmbridge, startExtension, tempDir } from './helpers';
import { fake } from './fake-vscode';

const MINE = '# my agents\n[agents.mine]\ncommand = "mine-agent"\n';
const settings = { path: '/opt/lmbridge', configFile: '~/agents.toml', logLevel: '', traceDir: '', http: '' };

function agent(id: string, start: string, here = 'yes'): RegistryAgent {
    return { id, name: `Agent ${id}`, start, here, note: '' };
}

describe('the add-agent command, its parts', () => {
    test('the config file is passed to add, not to list', () => {
        const add = agentsCommandLine(settings, ['add', 'cline']);
        assert.equal(add.command, '/opt/lmbridge');
        assert.deepEqual(add.args.slice(0, 4), ['agents', 'add', 'cline', '--config']);
        assert.ok(add.args[4].endsWith(`${path.sep}agents.toml`) && !add.args[4].startsWith('~'), add.args[4]);
        assert.deepEqual(agentsCommandLine(settings, ['list', '--json']).args, ['agents', 'list', '--json']);
        assert.equal(agentsCommandLine({ ...settings, path: ' ' }, ['list']).command, 'lmbridge');
    });

    test('a listing that is not the JSON expected is an error that says so', () => {
        assert.throws(() => parseListing('39 agents (snapshot)'), (error: Error) =>
            error instanceof AgentsCliError && /did not print JSON/.test(error.message));
        assert.throws(() => parseListing('{"source": "x"}'), /no agents list/);
        assert.throws(() => parseListing('{"agents": [{"name": "no id"}]}'), /no agents list/);
    });

    test('the agents lmbridge can start here come first; the others say why they cannot', () => {
        const items = pickItems({
            source: 'snapshot',
            agents: [
                agent('bin', '(a binary: download it)'),
                agent('uv', 'uvx crow-cli acp', 'uvx not found (install uv)'),
                agent('npm', 'npx -y cline@3.0.65 --acp'),
            ],
        });
        assert.deepEqual(items.map(item => item.description), ['npm', 'bin', 'uv']);
        assert.equal(items[0].detail, 'npx -y cline@3.0.65 --acp');
        assert.equal(items[1].detail, '(a binary: download it)');
        assert.equal(items[2].detail, 'uvx crow-cli acp — uvx not found (install uv)');
    });
});

describe('the add-agent command, with lmbridge', () => {
    let h: Harness;
    let config: string;

    before(() => {
        requireLmbridge();
    });

    beforeEach(async () => {
        await h?.stop();
        config = path.join(tempDir('add-agent'), 'config.toml');
        fs.writeFileSync(config, MINE);
        h = startExtension({ configFile: config });
    });

    after(async () => {
        await h?.stop();
    });

    async function agentIds(): Promise<string[]> {
        const token = new vscode.CancellationTokenSource().token;
        const models = await h.provider.provideLanguageModelChatInformation({ silent: true }, token);
        return models.map(model => model.id).filter(id => !id.includes('/')).sort();
    }

    test('a picked agent is written into the config file and becomes a model', async () => {
        assert.deepEqual(await agentIds(), ['demo', 'mine']);
        const pidBefore = h.api.bridge.pid;
        fake.answers.push('Cline');
        const added = await vscode.commands.executeCommand(ADD_AGENT_COMMAND);
        assert.equal(added, 'cline', `errors: ${fake.errorMessages.join(' | ')}`);
        assert.match(fake.prompts.at(-1) ?? '', /^Add an ACP agent to lmbridge: .*Cline/);
        const written = fs.readFileSync(config, 'utf8');
        assert.ok(written.startsWith(MINE), 'what the file had is kept');
        assert.match(written, /^\[agents\.cline\]$/m);
        assert.match(written, /^args = \["-y", "cline@[0-9.]+", "--acp"\]$/m);
        assert.match(fake.infoMessages.at(-1) ?? '', /added \[agents\.cline\] to /);
        assert.deepEqual(await agentIds(), ['cline', 'demo', 'mine']);
        assert.notEqual(h.api.bridge.pid, pidBefore, 'lmbridge was started again with the new config');
    });

    test('the same agent again, or one lmbridge cannot start here, is refused and the file kept', async () => {
        assert.equal(await vscode.commands.executeCommand(ADD_AGENT_COMMAND, 'cline'), 'cline');
        const before = fs.readFileSync(config, 'utf8');
        assert.equal(await vscode.commands.executeCommand(ADD_AGENT_COMMAND, 'cline'), undefined);
        assert.match(fake.errorMessages.at(-1) ?? '', /could not add the agent: .*already has \[agents\.cline\]/);
        assert.equal(await vscode.commands.executeCommand(ADD_AGENT_COMMAND, 'no-such-agent'), undefined);
        assert.match(fake.errorMessages.at(-1) ?? '', /no agent 'no-such-agent' in the registry/);
        assert.equal(await vscode.commands.executeCommand(ADD_AGENT_COMMAND, 'agoragentic'), undefined);
        assert.match(fake.errorMessages.at(-1) ?? '', /the registry names no package for Agoragentic/);
        assert.equal(fs.readFileSync(config, 'utf8'), before);
    });

    test('dismissing the pick adds nothing', async () => {
        const added = await vscode.commands.executeCommand(ADD_AGENT_COMMAND); // no answer queued: Escape
        assert.equal(added, undefined);
        assert.equal(fs.readFileSync(config, 'utf8'), MINE);
        assert.deepEqual(fake.errorMessages, []);
    });

    test('a config file that does not exist yet is created, private, and lmbridge then starts with it', async () => {
        fs.rmSync(config);
        assert.deepEqual(await agentIds(), [UNAVAILABLE_MODEL_ID], 'lmbridge cannot start without its config file');
        assert.equal(await vscode.commands.executeCommand(ADD_AGENT_COMMAND, 'cline'), 'cline');
        assert.equal(fs.statSync(config).mode & 0o777, 0o600);
        assert.deepEqual(await agentIds(), ['cline', 'demo']);
    });

    test('an lmbridge that is not there is named in the error', async () => {
        fake.configure({ path: path.join(tempDir('missing'), 'lmbridge') });
        assert.equal(await vscode.commands.executeCommand(ADD_AGENT_COMMAND, 'cline'), undefined);
        assert.match(fake.errorMessages.at(-1) ?? '', /was not found\. Install lmbridge .* "lmbridge\.path"/);
    });
});
