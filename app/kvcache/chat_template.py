"""Chat templates as transformers' apply_chat_template runs them, and messages as vLLM hands them over.

A sandboxed (immutable) Jinja environment with trim_blocks/lstrip_blocks and loopcontrols, a `tojson` that
neither escapes HTML nor sorts keys, `raise_exception` and `strftime_now`. Messages get vLLM's "string"
content format (text parts joined by newlines) and assistant tool-call arguments parsed from JSON, as
vLLM's _postprocess_messages does. `jinja2` is imported only when a template is compiled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Final

_MAX_VERDICTS: Final = 4096


class ChatRenderError(ValueError):
    """The body cannot be rendered with this chat template (the caller routes without exact hashes)."""


def load_chat_template(folder: Path, config: Mapping[str, Any]) -> str:
    """The default chat template of an HF model folder (chat_template.jinja, else tokenizer_config.json)."""
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path.read_text()
    tpl = config.get("chat_template")
    if isinstance(tpl, str):
        return tpl
    if isinstance(tpl, list):
        for item in tpl:
            if isinstance(item, dict) and item.get("name") == "default" and isinstance(item.get("template"), str):
                return str(item["template"])
    raise FileNotFoundError(f"no chat template in {folder}")


def compile_template(template: str) -> Any:
    """A chat template compiled the way transformers' apply_chat_template compiles it."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class Sandbox(ImmutableSandboxedEnvironment):
        """transformers' sandbox, with its attribute verdicts memoized: each depends only on the object's type
        and the attribute's name (is_internal_attribute and modifies_known_mutable test types), and the ABC
        isinstance checks behind them were half of a render."""

        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            self.verdicts: dict[tuple[type, str], bool] = {}

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            key = (type(obj), attr)
            safe = self.verdicts.get(key)
            if safe is None:
                safe = super().is_safe_attribute(obj, attr, value)
                if len(self.verdicts) < _MAX_VERDICTS:  # names come from the template: few, but bounded
                    self.verdicts[key] = safe
            return safe

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


def _text_content(content: Any) -> Any:
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                parts.append(str(part.get("text", "")))
            else:
                raise ChatRenderError("non-text content parts (images, audio, files) cannot be hashed in the gateway")
        return "\n".join(parts)
    return content


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as vLLM hands them to a string-content template."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if (
            isinstance(m, dict)
            and role != "developer"
            and not isinstance(m.get("content"), list)
            and not (role == "assistant" and isinstance(m.get("tool_calls"), list))
        ):
            out.append(m)  # nothing to change, and the immutable sandbox cannot change it: no copy
            continue
        msg = dict(m)
        if msg.get("role") == "developer":  # vLLM (like OpenAI) treats developer messages as system ones
            msg["role"] = "system"
        if "content" in msg:
            msg["content"] = _text_content(msg["content"])
        calls = msg.get("tool_calls")
        if msg.get("role") == "assistant" and isinstance(calls, list):
            if not calls:
                msg.pop("tool_calls")
            else:
                fixed = []
                for call in calls:
                    call = dict(call)
                    fn = dict(call.get("function") or {})
                    args = fn.get("arguments")
                    if isinstance(args, str):
                        try:
                            fn["arguments"] = json.loads(args) if args else {}
                        except (json.JSONDecodeError, RecursionError):  # arguments are the client's text
                            fn["arguments"] = {}
                    elif not args:
                        fn["arguments"] = {}
                    call["function"] = fn
                    fixed.append(call)
                msg["tool_calls"] = fixed
        out.append(msg)
    return out
