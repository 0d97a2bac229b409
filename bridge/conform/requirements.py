"""The requirements ``lmbridge conform`` judges, as data: each has an id (``LMB-<AREA>-<NNN>``), a tier, the spec
text it rests on (quoted from the ACP v1 docs, or JSON-RPC 2.0), the capability that makes it apply (if any) and
whether it needs the agent's model to do something. The checks that decide them live in ``checks``; this module
owns the words, the tiers and the verdict rule.

Tiers and the verdict follow acp-tck: the agent is conformant unless a MANDATORY requirement fails or was not
tested, a CAPABILITY requirement the agent advertised fails, or the run was blocked (authentication, an unsupported
protocol version). ADVISORY failures (SHOULDs) and INFORMATIONAL findings are reported, never held against it.

Quotes are from agentclientprotocol/agent-client-protocol, docs/protocol/v1 (commit b7f0005, 2026-08-22).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["BY_ID", "REQUIREMENTS", "Citation", "Requirement", "Status", "Tier"]

DOCS = "https://agentclientprotocol.com/protocol/v1/"
JSONRPC = "https://www.jsonrpc.org/specification"
# Methods not in the spec yet are described only by the unstable schema (its ForkSessionRequest, …).
UNSTABLE_SCHEMA = "https://github.com/agentclientprotocol/agent-client-protocol/blob/main/schema/schema.unstable.json"


class Tier(enum.Enum):
    MANDATORY = "MANDATORY"  # a MUST of the spec; failing (or not testing) it makes the agent non-conformant
    CAPABILITY = "CAPABILITY"  # a MUST that applies once the agent advertises a capability
    ADVISORY = "ADVISORY"  # a SHOULD; reported, not held against the agent
    INFORMATIONAL = "INFORMATIONAL"  # behaviour the spec leaves open; reported as found


class Status(enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIPPED = "SKIPPED"  # does not apply (not advertised), or cannot run here (auth, needs a model): the reason says
    NOT_TESTED = "NOT_TESTED"  # should have run but could not (the agent crashed or hung before it)


@dataclass(frozen=True)
class Citation:
    url: str
    text: str


@dataclass(frozen=True)
class Requirement:
    id: str
    tier: Tier
    title: str
    cites: tuple[Citation, ...]
    group: str  # which check group decides it (one fresh agent process per group)
    capability: str | None = None  # dotted path in agentCapabilities that makes it apply (CAPABILITY tier)
    needs_model: bool = False  # the agent's model must do something specific
    # For another tier: the dotted path in agentCapabilities without which it does not apply (a SHOULD or a finding
    # about a method the agent may not offer).
    applies_if: str | None = None

    @property
    def area(self) -> str:
        return self.id.split("-")[1]


def _r(
    id: str,
    tier: Tier,
    title: str,
    group: str,
    *cites: tuple[str, str],
    capability: str | None = None,
    needs_model: bool = False,
    applies_if: str | None = None,
) -> Requirement:
    citations = tuple(Citation(u, t) for u, t in cites)
    return Requirement(id, tier, title, citations, group, capability, needs_model, applies_if)


M, C, A, INFO = Tier.MANDATORY, Tier.CAPABILITY, Tier.ADVISORY, Tier.INFORMATIONAL

REQUIREMENTS: tuple[Requirement, ...] = (
    # -- initialization ---------------------------------------------------------------------------------------------
    _r(
        "LMB-INIT-001",
        M,
        "initialize is answered with a valid InitializeResponse",
        "initialize",
        (
            DOCS + "initialization",
            "The Agent MUST respond with the chosen protocol version and the capabilities it supports.",
        ),
    ),
    _r(
        "LMB-INIT-002",
        M,
        "asked for a protocol version it supports, the agent answers with that version (an integer)",
        "initialize",
        (
            DOCS + "initialization#version-negotiation",
            "If the Agent supports the requested version, it MUST respond with the same version.",
        ),
        (
            DOCS + "initialization#protocol-version",
            "The protocol versions that appear in the initialize requests and responses are a single integer that "
            "identifies a MAJOR protocol version.",
        ),
    ),
    _r(
        "LMB-INIT-003",
        M,
        "asked for a version it does not support, the agent answers with the latest version it supports",
        "negotiation",
        (
            DOCS + "initialization#version-negotiation",
            "Otherwise, the Agent MUST respond with the latest version it supports.",
        ),
    ),
    _r(
        "LMB-INIT-004",
        A,
        "the initialize answer names the agent (agentInfo with name and version)",
        "initialize",
        (
            DOCS + "initialization#implementation-information",
            "Both Clients and Agents SHOULD provide information about their implementation in the clientInfo and "
            "agentInfo fields respectively.",
        ),
    ),
    _r(
        "LMB-INIT-005",
        INFO,
        "time from start to the initialize answer",
        "initialize",
        (DOCS + "initialization", "(informational: how long an editor waits before the first session)"),
    ),
    # -- sessions ---------------------------------------------------------------------------------------------------
    _r(
        "LMB-SESS-001",
        M,
        "session/new is answered with a valid NewSessionResponse",
        "sessions",
        (
            DOCS + "session-setup#creating-a-session",
            "The Agent MUST respond with a unique Session ID that identifies this conversation",
        ),
    ),
    _r(
        "LMB-SESS-002",
        M,
        "two session/new requests get two different session ids",
        "sessions",
        (
            DOCS + "session-setup#creating-a-session",
            "The Agent MUST respond with a unique Session ID that identifies this conversation",
        ),
    ),
    _r(
        "LMB-SESS-003",
        C,
        "session/list is answered with a valid ListSessionsResponse",
        "sessions",
        (
            DOCS + "session-list#listing-sessions",
            "The Agent MUST respond with a list of sessions and optional pagination metadata",
        ),
        capability="sessionCapabilities.list",
    ),
    _r(
        "LMB-SESS-004",
        C,
        "session/close of an open session is answered with a valid CloseSessionResponse",
        "sessions",
        (
            DOCS + "session-setup#closing-active-sessions",
            "The Agent MUST cancel any ongoing work for that session as if session/cancel had been called, then "
            "free the resources associated with the session.",
        ),
        capability="sessionCapabilities.close",
    ),
    _r(
        "LMB-SESS-005",
        C,
        "session/new with additionalDirectories (absolute paths) is answered with a valid NewSessionResponse",
        "sessions",
        (
            DOCS + "session-setup#creating-a-session",
            "The Agent MUST respond with a unique Session ID that identifies this conversation",
        ),
        capability="sessionCapabilities.additionalDirectories",
    ),
    _r(
        "LMB-SESS-006",
        C,
        "session/load of a session with history replays it as session/update notifications before answering",
        "history",
        (
            DOCS + "session-setup#loading-sessions",
            "The Agent MUST replay the entire conversation to the Client in the form of session/update "
            "notifications (like session/prompt).",
        ),
        (
            DOCS + "session-setup#loading-sessions",
            "When all the conversation entries have been streamed to the Client, the Agent MUST respond to the "
            "original session/load request.",
        ),
        capability="loadSession",
        needs_model=True,
    ),
    _r(
        "LMB-SESS-007",
        C,
        "session/resume of a session with history is answered without replaying it",
        "history",
        (
            DOCS + "session-setup#resuming-sessions",
            "Unlike session/load, the Agent MUST NOT replay the conversation history via session/update "
            "notifications before responding.",
        ),
        capability="sessionCapabilities.resume",
        needs_model=True,
    ),
    _r(
        "LMB-SESS-008",
        INFO,
        "a request naming a session that does not exist is answered with an error, and the agent carries on",
        "robustness",
        (DOCS + "overview#error-handling", "All methods follow standard JSON-RPC 2.0 error handling"),
    ),
    _r(
        "LMB-SESS-009",
        C,
        "session/delete of a session the client created is answered with a valid DeleteSessionResponse",
        "sessions",
        (DOCS + "session-delete#deleting-a-session", "On success, the Agent returns an empty result"),
        capability="sessionCapabilities.delete",
    ),
    _r(
        "LMB-SESS-010",
        C,
        "a deleted session with a history no longer appears in session/list (judged when it was listed before its "
        "deletion)",
        "history",
        (DOCS + "session-delete#semantics", "Deleted sessions no longer appear in future session/list results."),
        capability="sessionCapabilities.delete",
        needs_model=True,
    ),
    _r(
        "LMB-SESS-011",
        A,
        "session/delete of a session already deleted, or of one that never existed, succeeds silently (when "
        "sessionCapabilities.delete is advertised)",
        "sessions",
        (
            DOCS + "session-delete#semantics",
            "Deleting an already-deleted session, or a session that never existed, SHOULD succeed silently.",
        ),
        applies_if="sessionCapabilities.delete",
    ),
    _r(
        "LMB-SESS-012",
        INFO,
        "session/fork (unstable) of a session with one turn answers a new session, which takes a prompt and carries "
        "the conversation to its model (when sessionCapabilities.fork is advertised)",
        "history",
        (
            UNSTABLE_SCHEMA,
            "Creates a new session based on the context of an existing one, allowing operations like generating "
            "summaries without affecting the original session's history.",
        ),
        needs_model=True,
        applies_if="sessionCapabilities.fork",
    ),
    _r(
        "LMB-MODE-001",
        M,
        "a session that offers modes takes session/set_mode (to its current mode): a valid SetSessionModeResponse",
        "sessions",
        (
            DOCS + "session-modes",
            "(SessionModeState: currentModeId, availableModes; the client sets one with session/set_mode)",
        ),
    ),
    _r(
        "LMB-MODE-002",
        M,
        "a session that offers more than one mode takes session/set_mode to another of them (and back): a valid "
        "SetSessionModeResponse each time, and the last current_mode_update sent after the set-back request (none "
        "is required) names the mode set back",
        "sessions",
        (
            DOCS + "session-modes#from-the-client",
            "The ID of the mode to switch to. Must be one of the modes listed in availableModes",
        ),
        (
            DOCS + "session-modes#from-the-agent",
            "The Agent can also change its own mode and let the Client know by sending the current_mode_update "
            "session notification",
        ),
    ),
    _r(
        "LMB-CONFIG-001",
        M,
        "a session that offers config options takes session/set_config_option (a select option, to its current "
        "value), answered with the complete list of options and their current values",
        "sessions",
        (
            DOCS + "session-config-options#from-the-client",
            "The Agent MUST respond with the complete list of all configuration options and their current values",
        ),
    ),
    _r(
        "LMB-CONFIG-002",
        M,
        "a select config option set to another of its values (and back) is answered with that value as the "
        "option's currentValue",
        "sessions",
        (
            DOCS + "session-config-options#from-the-client",
            "The Agent MUST respond with the complete list of all configuration options and their current values",
        ),
    ),
    # -- prompt turns -----------------------------------------------------------------------------------------------
    _r(
        "LMB-PROMPT-001",
        M,
        "session/prompt is answered with a valid PromptResponse and one of ACP's stop reasons",
        "prompt",
        (
            DOCS + "prompt-turn#4-check-for-completion",
            "If there are no pending tool calls, the turn ends and the Agent MUST respond to the original "
            "session/prompt request with a StopReason",
        ),
        needs_model=True,
    ),
    _r(
        "LMB-PROMPT-002",
        M,
        "every session/update is a valid SessionNotification for a session the agent created",
        "prompt",
        (DOCS + "prompt-turn", "(the SessionNotification schema; session ids as answered by session/new)"),
        needs_model=True,
    ),
    _r(
        "LMB-PROMPT-003",
        M,
        "a session takes a second prompt after the first one ended",
        "prompt",
        (
            DOCS + "prompt-turn#4-check-for-completion",
            "the turn ends and the Agent MUST respond to the original session/prompt request with a StopReason",
        ),
        needs_model=True,
    ),
    # -- cancel -----------------------------------------------------------------------------------------------------
    _r(
        "LMB-CANCEL-001",
        M,
        "after session/cancel, the prompt is answered with stop reason cancelled",
        "cancel",
        (
            DOCS + "prompt-turn#cancellation",
            "After all ongoing operations have been successfully aborted and pending updates have been sent, the "
            "Agent MUST respond to the original session/prompt request with the cancelled stop reason.",
        ),
        needs_model=True,
    ),
    _r(
        "LMB-CANCEL-002",
        M,
        "no session/update for a cancelled turn after its prompt was answered",
        "cancel",
        (
            DOCS + "prompt-turn#cancellation",
            "The Agent MAY send session/update notifications with content or tool call updates after receiving "
            "the session/cancel notification, but it MUST ensure that it does so before responding to the "
            "session/prompt request.",
        ),
        needs_model=True,
    ),
    _r(
        "LMB-CANCEL-003",
        M,
        "the session takes the next prompt after a cancelled one",
        "cancel",
        (
            DOCS + "prompt-turn#4-check-for-completion",
            "the turn ends and the Agent MUST respond to the original session/prompt request with a StopReason",
        ),
        needs_model=True,
    ),
    _r(
        "LMB-CANCEL-004",
        M,
        "a cancel sent at once after the prompt, before anything of the turn came, still ends it with stop reason "
        "cancelled (or, had it ended first, its own stop reason), never an error",
        "cancel",
        (
            DOCS + "prompt-turn#cancellation",
            "Agents MUST catch these errors and return the semantically meaningful cancelled stop reason",
        ),
        needs_model=True,
    ),
    # -- MCP and tool calls -----------------------------------------------------------------------------------------
    _r(
        "LMB-MCP-001",
        M,
        "the agent connects to a stdio MCP server given in session/new (initialize and tools/list reach it)",
        "tools",
        (
            DOCS + "session-setup#stdio-transport",
            "All Agents MUST support connecting to MCP servers via stdio",
        ),
        needs_model=True,
    ),
    _r(
        "LMB-MCP-002",
        M,
        "the model's call of that server's tool reaches the server with its arguments, and the result reaches the "
        "model",
        "tools",
        (
            DOCS + "session-setup#mcp-servers",
            "Clients MAY include connection details for MCP servers that the Agent should connect to.",
        ),
        (
            DOCS + "session-setup#stdio-transport",
            "All Agents MUST support connecting to MCP servers via stdio",
        ),
        needs_model=True,
    ),
    _r(
        "LMB-MCP-004",
        C,
        "an HTTP MCP server given in session/new is connected with the headers given, and the model's call of its "
        "tool reaches it and its result reaches the model",
        "tools",
        (
            DOCS + "session-setup#http-transport",
            "When the Agent supports mcpCapabilities.http, Clients can specify MCP servers configurations using the "
            "HTTP transport. … headers (HttpHeader[], required): HTTP headers to include in requests to the server",
        ),
        capability="mcpCapabilities.http",
        needs_model=True,
    ),
    _r(
        "LMB-MCP-003",
        A,
        "the call is reported to the client as a tool call",
        "tools",
        (
            DOCS + "tool-calls#creating",
            "When the language model requests a tool invocation, the Agent SHOULD report it to the Client",
        ),
        needs_model=True,
    ),
    _r(
        "LMB-TOOL-001",
        A,
        "tool_call_update names a tool call announced before; a status never goes back; none is left pending or "
        "in_progress when the turn ends",
        "tools",
        (DOCS + "tool-calls#updating", "All fields except toolCallId are optional in updates."),
        (
            DOCS + "prompt-turn#5-tool-invocation-and-status-updates",
            "the Agent SHOULD invoke the tool and report a status update marking the tool as in_progress",
        ),
        needs_model=True,
    ),
    # -- permissions ------------------------------------------------------------------------------------------------
    _r(
        "LMB-PERM-001",
        M,
        "a permission request is a valid RequestPermissionRequest for the session, with its tool call and options",
        "permissions",
        (
            DOCS + "tool-calls#requesting-permission",
            "Request for user permission to execute a tool call. Sent when the agent needs authorization before "
            "performing a sensitive operation.",
        ),
        needs_model=True,
    ),
    _r(
        "LMB-PERM-002",
        M,
        "an operation the client rejected is not performed",
        "permissions",
        (DOCS + "schema#permissionoptionkind", "reject_once: Reject this operation only this time."),
        needs_model=True,
    ),
    _r(
        "LMB-PERM-003",
        M,
        "a cancel while a permission request is pending (answered cancelled, as the client must) ends the prompt "
        "with stop reason cancelled, and the operation is not performed",
        "permissions",
        (
            DOCS + "tool-calls#requesting-permission",
            'If the current prompt turn gets cancelled, the Client MUST respond with the "cancelled" outcome',
        ),
        (
            DOCS + "prompt-turn#cancellation",
            "the Agent MUST respond to the original session/prompt request with the cancelled stop reason.",
        ),
        needs_model=True,
    ),
    _r(
        "LMB-PERM-004",
        INFO,
        "a command allowed with an allow_always option runs again in the session without another permission request",
        "permissions",
        (DOCS + "schema#permissionoptionkind", "allow_always: Allow this operation and remember the choice."),
        needs_model=True,
    ),
    # -- prompt content ---------------------------------------------------------------------------------------------
    _r(
        "LMB-CONTENT-001",
        M,
        "a prompt with a resource_link block beside its text is taken: the turn ends with a stop reason",
        "content",
        (
            DOCS + "initialization#prompt-capabilities",
            "As a baseline, all Agents MUST support ContentBlock::Text and ContentBlock::ResourceLink in "
            "session/prompt requests.",
        ),
        needs_model=True,
    ),
    _r(
        "LMB-CONTENT-002",
        C,
        "with promptCapabilities.image advertised, a prompt with an image block is taken",
        "content",
        (DOCS + "initialization#prompt-capabilities", "image: The prompt may include ContentBlock::Image"),
        capability="promptCapabilities.image",
        needs_model=True,
    ),
    _r(
        "LMB-CONTENT-003",
        C,
        "with promptCapabilities.audio advertised, a prompt with an audio block is taken",
        "content",
        (DOCS + "initialization#prompt-capabilities", "audio: The prompt may include ContentBlock::Audio"),
        capability="promptCapabilities.audio",
        needs_model=True,
    ),
    _r(
        "LMB-CONTENT-004",
        C,
        "with promptCapabilities.embeddedContext advertised, a prompt with an embedded resource is taken",
        "content",
        (
            DOCS + "initialization#prompt-capabilities",
            "embeddedContext: The prompt may include ContentBlock::Resource",
        ),
        capability="promptCapabilities.embeddedContext",
        needs_model=True,
    ),
    _r(
        "LMB-CONTENT-005",
        INFO,
        "what of each content block sent reached the agent's model (a scripted model's requests)",
        "content",
        (
            DOCS + "content",
            "Content blocks represent displayable information that flows through the Agent Client Protocol.",
        ),
        needs_model=True,
    ),
    # -- the client's capabilities ----------------------------------------------------------------------------------
    _r(
        "LMB-CAP-001",
        M,
        "the agent never calls fs/* or terminal/* methods the client did not advertise",
        "prompt",
        (
            DOCS + "file-system#checking-support",
            "If readTextFile or writeTextFile is false or not present, the Agent MUST NOT attempt to call the "
            "corresponding filesystem method.",
        ),
        (
            DOCS + "terminals#checking-support",
            "If terminal is false or not present, the Agent MUST NOT attempt to call any terminal methods.",
        ),
        needs_model=True,
    ),
    # -- the client's file system and terminals, advertised ---------------------------------------------------------
    _r(
        "LMB-FS-001",
        M,
        "fs/read_text_file and fs/write_text_file requests name the session and an absolute path",
        "client",
        (DOCS + "file-system#reading-files", "path (string, required): Absolute path to the file to read"),
        (DOCS + "file-system#writing-files", "path (string, required): Absolute path to the file to write."),
        needs_model=True,
    ),
    _r(
        "LMB-TERM-001",
        M,
        "terminal/create requests name the session, a command, and an absolute cwd when they give one",
        "client",
        (
            DOCS + "terminals#executing-commands",
            "cwd (string): Working directory for the command. Must be an absolute path.",
        ),
        needs_model=True,
    ),
    _r(
        "LMB-TERM-002",
        M,
        "every terminal the agent creates is released with terminal/release (by the time its session is closed)",
        "client",
        (
            DOCS + "terminals#executing-commands",
            "The Agent MUST release the terminal using terminal/release when it's no longer needed.",
        ),
        (DOCS + "terminals#killing-commands", "The Agent MUST still call terminal/release when it's done using it."),
        needs_model=True,
    ),
    _r(
        "LMB-TERM-003",
        INFO,
        "with the client's terminal and file system advertised, the agent runs a shell command in a client terminal "
        "and reads a file through the client, and what they gave reaches its model",
        "client",
        (
            DOCS + "terminals",
            "The terminal methods allow Agents to execute shell commands within the Client's environment.",
        ),
        (
            DOCS + "file-system",
            "The filesystem methods allow Agents to read and write text files within the Client's environment.",
        ),
        needs_model=True,
    ),
    _r(
        "LMB-TERM-004",
        A,
        "a cancel while a command runs in a client terminal stops it: terminal/kill or terminal/release, before the "
        "prompt is answered cancelled or right after",
        "client",
        (
            DOCS + "prompt-turn#cancellation",
            "The Agent SHOULD stop all language model requests and all tool call invocations as soon as possible",
        ),
        (
            DOCS + "terminals#killing-commands",
            "The terminal/kill method terminates a command without releasing the terminal",
        ),
        needs_model=True,
    ),
    _r(
        "LMB-CANCEL-005",
        A,
        "a cancel while the agent runs a shell command itself (not in a client terminal) stops the command: no "
        "process of it is left once the prompt is answered cancelled",
        "client",
        (
            DOCS + "prompt-turn#cancellation",
            "The Agent SHOULD stop all language model requests and all tool call invocations as soon as possible",
        ),
        needs_model=True,
    ),
    # -- extensibility ----------------------------------------------------------------------------------------------
    _r(
        "LMB-EXT-001",
        M,
        "an unknown extension request (a method starting with _) is answered, with its id",
        "robustness",
        (
            DOCS + "extensibility#custom-requests",
            "Upon receiving a custom request, implementations MUST respond accordingly with the provided id",
        ),
    ),
    _r(
        "LMB-EXT-002",
        A,
        "an unknown extension request is answered with Method not found (-32601)",
        "robustness",
        (
            DOCS + "extensibility#custom-requests",
            "If the receiving end doesn't recognize the custom method name, it should respond with the standard "
            '"Method not found" error',
        ),
    ),
    _r(
        "LMB-EXT-003",
        A,
        "an unknown extension notification is ignored: the agent answers the next request",
        "robustness",
        (
            DOCS + "extensibility#custom-notifications",
            "Unlike with custom requests, implementations SHOULD ignore unrecognized notifications.",
        ),
    ),
    _r(
        "LMB-EXT-004",
        M,
        "a request carrying a _meta object is accepted (session/new)",
        "sessions",
        (
            DOCS + "extensibility#the-_meta-field",
            "The _meta property is reserved by ACP to allow clients and agents to attach additional metadata to "
            "their interactions.",
        ),
    ),
    # -- JSON-RPC ---------------------------------------------------------------------------------------------------
    _r(
        "LMB-RPC-001",
        M,
        "a request for a method the agent does not have is answered (a response with its id)",
        "robustness",
        (
            JSONRPC + "#response_object",
            "When a rpc call is made, the Server MUST reply with a Response, except for in the case of Notifications.",
        ),
    ),
    _r(
        "LMB-RPC-002",
        A,
        "a request for a method the agent does not have is answered with Method not found (-32601)",
        "robustness",
        (JSONRPC + "#error_object", "-32601 Method not found: The method does not exist / is not available."),
    ),
    _r(
        "LMB-RPC-003",
        M,
        "every message is JSON-RPC 2.0: jsonrpc 2.0, answers with the request's id and exactly one of "
        "result and error, errors with an integer code and a string message",
        "all",
        (
            DOCS + "overview#error-handling",
            "Successful responses include a result field; Errors include an error object with code and message; "
            "Notifications never receive responses (success or error)",
        ),
        (
            JSONRPC + "#response_object",
            "id: This member is REQUIRED. It MUST be the same as the value of the id member in the Request Object. "
            "If there was an error in detecting the id in the Request Object (e.g. Parse error/Invalid Request), "
            "it MUST be Null.",
        ),
    ),
    # -- stdio ------------------------------------------------------------------------------------------------------
    _r(
        "LMB-STDIO-001",
        M,
        "nothing but ACP messages on stdout, one per line",
        "all",
        (DOCS + "transports#stdio", "The agent MUST NOT write anything to its stdout that is not a valid ACP message."),
        (
            DOCS + "transports#stdio",
            "Messages are delimited by newlines (\\n), and MUST NOT contain embedded newlines.",
        ),
    ),
    _r(
        "LMB-STDIO-002",
        INFO,
        "a line that is not JSON does not stop the agent: it answers the next request",
        "robustness",
        (
            DOCS + "transports#stdio",
            "The client MUST NOT write anything to the agent's stdin that is not a valid ACP message. (what the "
            "agent does when one does is not specified)",
        ),
    ),
    _r(
        "LMB-STDIO-004",
        INFO,
        "a valid request nested 10,000 deep, and one of 8 MiB, do not stop the agent: it answers the next request",
        "robustness",
        (
            JSONRPC,
            "(JSON-RPC 2.0 and ACP set no limit on a message's depth or size: what an agent does with these is "
            "reported, not judged)",
        ),
    ),
    _r(
        "LMB-STDIO-003",
        INFO,
        "bytes the agent wrote to stderr during the run",
        "all",
        (DOCS + "transports#stdio", "The agent MAY write UTF-8 strings to its standard error (stderr) for logging."),
    ),
    # -- authentication -----------------------------------------------------------------------------------------------
    _r(
        "LMB-AUTH-001",
        C,
        "logout is answered with a valid LogoutResponse (run only with --logout: it ends the agent's login on this "
        "machine)",
        "logout",
        (
            DOCS + "authentication#logging-out",
            "The logout method allows Clients to end the current authenticated state. Clients should only call it "
            "after verifying the Agent advertised agentCapabilities.auth.logout during initialization.",
        ),
        capability="auth.logout",
    ),
    _r(
        "LMB-AUTH-002",
        INFO,
        "after logout, a new session opens, or is refused with auth_required (-32000) until authenticate (when "
        "auth.logout is advertised)",
        "logout",
        (
            DOCS + "authentication#logging-out",
            "After logout, new sessions that require authentication will require the Client to call authenticate "
            "again.",
        ),
        applies_if="auth.logout",
    ),
    _r(
        "LMB-SHUT-001",
        INFO,
        "with its stdin closed, the agent exits within 5 s",
        "shutdown",
        (DOCS + "transports#stdio", "(the sequence diagram: Close stdin, terminate subprocess; no normative text)"),
    ),
)

BY_ID = {requirement.id: requirement for requirement in REQUIREMENTS}
assert len(BY_ID) == len(REQUIREMENTS), "requirement ids must be unique"
