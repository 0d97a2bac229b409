"""A model an editor shares (``initialize.editorModels``, ``editor/modelsChanged``): its entry, checked.

Kept free of Trio and of dataclasses, like ``bridge.config``: ``lmbridge stdio`` reads the editor's ``initialize``
before it imports the rest.
"""

from typing import Any, NamedTuple

from wire.errors import InvalidParams

__all__ = ["SharedModel", "parse_shared_models"]

_MAX_MODELS = 256  # more is a mistake on the editor's side, not a list a client or an agent could choose from


class SharedModel(NamedTuple):
    """One model as the editor described it: the shape of an ``lm/models`` entry."""

    id: str
    name: str
    vendor: str = ""
    family: str = ""
    version: str = ""
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    tool_calling: bool = False
    image_input: bool = False

    def describe(self) -> dict[str, Any]:
        """The entry as the editor protocol writes it."""
        entry: dict[str, Any] = {"id": self.id, "name": self.name}
        for key, value in (("vendor", self.vendor), ("family", self.family), ("version", self.version)):
            if value:
                entry[key] = value
        if self.max_input_tokens is not None:
            entry["maxInputTokens"] = self.max_input_tokens
        if self.max_output_tokens is not None:
            entry["maxOutputTokens"] = self.max_output_tokens
        entry["capabilities"] = {"toolCalling": self.tool_calling, "imageInput": self.image_input}
        return entry


def parse_shared_models(raw: Any, where: str) -> tuple[SharedModel, ...]:
    """Check a list of model entries; ``InvalidParams`` names the first field that is wrong. An id given twice is
    an error too: the editor would not know which one lmbridge asks for."""
    if not isinstance(raw, list):
        raise InvalidParams(where, "must be a list of models, each {id, name, ...}")
    if len(raw) > _MAX_MODELS:
        raise InvalidParams(where, f"at most {_MAX_MODELS} models")
    models: list[SharedModel] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw):
        at = f"{where}[{index}]"
        if not isinstance(entry, dict):
            raise InvalidParams(at, "must be an object {id, name, ...}")
        model_id = _text(entry, "id", at, required=True)
        if model_id in seen:
            raise InvalidParams(f"{at}.id", f"{model_id!r} is shared twice")
        seen.add(model_id)
        capabilities = entry.get("capabilities") or {}
        if not isinstance(capabilities, dict):
            raise InvalidParams(f"{at}.capabilities", "must be an object")
        models.append(
            SharedModel(
                model_id,
                _text(entry, "name", at, required=True),
                _text(entry, "vendor", at),
                _text(entry, "family", at),
                _text(entry, "version", at),
                _count(entry, "maxInputTokens", at),
                _count(entry, "maxOutputTokens", at),
                _flag(capabilities, "toolCalling", f"{at}.capabilities"),
                _flag(capabilities, "imageInput", f"{at}.capabilities"),
            )
        )
    return tuple(models)


def _text(entry: dict[str, Any], key: str, at: str, *, required: bool = False) -> str:
    value = entry.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value or len(value) > 256:
        raise InvalidParams(f"{at}.{key}", "must be a string of 1 to 256 characters")
    return value


def _count(entry: dict[str, Any], key: str, at: str) -> int | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**40:
        raise InvalidParams(f"{at}.{key}", "must be a positive integer")
    return value


def _flag(capabilities: dict[str, Any], key: str, at: str) -> bool:
    value = capabilities.get(key, False)
    if not isinstance(value, bool):
        raise InvalidParams(f"{at}.{key}", "must be true or false")
    return value
