/**
 * The "lmbridge: Add an agent" command: the ACP registry's agents as `lmbridge agents list --json` gives them (the
 * snapshot shipped with lmbridge, or the list `lmbridge agents update` fetched), one picked, and `lmbridge agents add`
 * writing its `[agents.<id>]` table into the config file this extension runs lmbridge with. lmbridge is then started
 * again, so that the new agent appears as a model. lmbridge's CLI does the work: the list and the table are the same
 * as in a terminal.
 */

import { execFile } from 'node:child_process';
import * as vscode from 'vscode';
import { type BridgeSettings, configArgs, lmbridgeProgram } from './bridge';

export const ADD_AGENT_COMMAND = 'lmbridge.addAgent';

/** One agent of `lmbridge agents list --json`. */
export interface RegistryAgent {
    id: string;
    name: string;
    /** How lmbridge would start it (`npx -y …`), or why it cannot (`(a binary: download it)`). */
    start: string;
    /** "yes", or what this machine lacks to start it (`npx not found …`). */
    here: string;
    note: string;
}

export interface RegistryListing {
    source: string;
    agents: RegistryAgent[];
}

export interface AgentPick extends vscode.QuickPickItem {
    agent: RegistryAgent;
}

/** How long one `lmbridge agents …` may take: it reads a file and writes one, in well under a second. */
const CLI_TIMEOUT_MS = 30_000;

/** The command line of `lmbridge agents ACTION…` with these settings (`add` gets the settings' config file). */
export function agentsCommandLine(settings: BridgeSettings, action: string[]): { command: string; args: string[] } {
    const config = action[0] === 'add' ? configArgs(settings) : [];
    return { command: lmbridgeProgram(settings), args: ['agents', ...action, ...config] };
}

export class AgentsCliError extends Error {
    constructor(message: string) {
        super(message);
        this.name = 'AgentsCliError';
    }
}

/** Run `lmbridge agents ACTION…`: its stdout and stderr; an `AgentsCliError` saying why when it fails. */
export function runAgentsCli(settings: BridgeSettings, action: string[]): Promise<{ stdout: string; stderr: string }> {
    const { command, args } = agentsCommandLine(settings, action);
    return new Promise((resolve, reject) => {
        execFile(command, args, { timeout: CLI_TIMEOUT_MS, maxBuffer: 8 << 20, windowsHide: true }, (error, stdout, stderr) => {
            if (!error) {
                resolve({ stdout, stderr });
                return;
            }
            const code = (error as NodeJS.ErrnoException).code;
            if (code === 'ENOENT') {
                reject(new AgentsCliError(`'${command}' was not found. Install lmbridge and put it on PATH, or set the ` +
                    '"lmbridge.path" setting to the lmbridge program.'));
            } else if (error.killed) {
                reject(new AgentsCliError(`'${command} ${args.join(' ')}' did not finish within ${CLI_TIMEOUT_MS / 1000} s.`));
            } else {
                // lmbridge's own message ("lmbridge agents: …") says what to do next; keep it whole.
                const said = stderr.trim() || stdout.trim() || error.message;
                reject(new AgentsCliError(said.replace(/^lmbridge agents: /, '')));
            }
        });
    });
}

/** `lmbridge agents list --json`'s output, checked: a clear error when it is not what this extension expects. */
export function parseListing(stdout: string): RegistryListing {
    let document: unknown;
    try {
        document = JSON.parse(stdout);
    } catch {
        throw new AgentsCliError(`'lmbridge agents list --json' did not print JSON (is lmbridge too old?): ${stdout.slice(0, 200)}`);
    }
    const listing = document as Partial<RegistryListing> | null;
    if (!listing || typeof listing !== 'object' || !Array.isArray(listing.agents)
        || !listing.agents.every(agent => agent && typeof agent.id === 'string' && typeof agent.name === 'string')) {
        throw new AgentsCliError('\'lmbridge agents list --json\' printed no agents list (is lmbridge too old?)');
    }
    return { source: String(listing.source ?? ''), agents: listing.agents };
}

/** The quick pick's items: the agents lmbridge can start here first, then those it cannot (saying why). */
export function pickItems(listing: RegistryListing): AgentPick[] {
    const startable = (agent: RegistryAgent) => !agent.start.startsWith('(') && agent.here === 'yes';
    const item = (agent: RegistryAgent): AgentPick => {
        const why = startable(agent) ? '' : agent.start.startsWith('(') ? agent.start : `${agent.start} — ${agent.here}`;
        return {
            label: agent.name,
            description: agent.id,
            detail: why || agent.start,
            agent,
        };
    };
    return [...listing.agents.filter(startable), ...listing.agents.filter(agent => !startable(agent))].map(item);
}

export interface AddAgentDeps {
    settings: () => BridgeSettings;
    /** Start lmbridge again with the new config, and tell VS Code the models changed. */
    restart: () => Promise<void>;
}

/**
 * The command: `id` (from another extension or a keybinding) adds that agent without asking; otherwise the person
 * picks one. Returns the id added, or undefined (dismissed, or it failed: an error notification says why).
 */
export async function addAgent(deps: AddAgentDeps, id?: unknown): Promise<string | undefined> {
    const settings = deps.settings();
    try {
        let chosen = typeof id === 'string' && id ? id : undefined;
        if (chosen === undefined) {
            const listing = parseListing((await runAgentsCli(settings, ['list', '--json'])).stdout);
            const picked = await vscode.window.showQuickPick(pickItems(listing), {
                title: 'Add an ACP agent to lmbridge',
                placeHolder: `${listing.agents.length} agents (${listing.source}); each becomes a model`,
                matchOnDescription: true,
                matchOnDetail: true,
            });
            if (!picked) {
                return undefined;
            }
            chosen = picked.agent.id;
        }
        const { stdout, stderr } = await runAgentsCli(settings, ['add', chosen]);
        await deps.restart();
        const note = stderr.trim().replace(/^note: /, '');
        void vscode.window.showInformationMessage(stdout.trim() + (note ? ` (${note})` : ''));
        return chosen;
    } catch (error) {
        const message = error instanceof AgentsCliError ? error.message : String((error as Error)?.message ?? error);
        void vscode.window.showErrorMessage(`lmbridge could not add the agent: ${message}`);
        return undefined;
    }
}
