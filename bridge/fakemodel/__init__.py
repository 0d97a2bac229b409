"""``lmbridge fake-model``: a scripted model server for running real agents offline, in lmbridge's own tests, in
the conformance kit (``lmbridge conform --model fake``) and in agent authors' tests.

- ``server``: the server: Anthropic Messages, OpenAI Responses and Chat Completions, Gemini; the script
  vocabulary (``say``, ``call``, ``parallel``, ``stall``); the record of every request
- ``script``: script files (JSON) for the command line
- ``recipes``: how each known agent is pointed at a model server (environment, arguments, files in its HOME)
- ``command``: the ``lmbridge fake-model`` arguments and entry point

May import: nothing of lmbridge (Trio only). It only listens on 127.0.0.1 and never connects anywhere.
"""
