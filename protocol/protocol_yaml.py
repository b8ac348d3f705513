"""Reading a protocol file before it is a model: at most 1 MiB of UTF-8, parsed once (libyaml), no key given twice,
no alias bomb; and the YAML line of a field, so every refusal names file, line and field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from protocol.errors import RefusedError

MAX_PROTOCOL_BYTES = 1 << 20  # refused before parsing: a protocol is a few kB
MAX_PROTOCOL_NODES = 100_000  # YAML nodes after aliases are followed (a shipped protocol has ~300)
# libyaml's C parser when PyYAML was built with it (the pure-Python one is ~20x slower)
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def node_at(node: yaml.Node | None, loc: tuple[int | str, ...]) -> yaml.Node | None:
    """The deepest YAML node along a pydantic error location."""
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            found = next((v for k, v in node.value if getattr(k, "value", None) == key), None)
            if found is None:
                found = next((k for k, _ in node.value if getattr(k, "value", None) == key), None)
                return found or node
            node = found
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            return node
    return node


def line_of(node: yaml.Node | None) -> int:
    return node.start_mark.line + 1 if node is not None else 1


def field_name(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and p in ("tree", "GitSource")))


def read_text(path: Path) -> str:
    """The protocol's text: at most MAX_PROTOCOL_BYTES of UTF-8, checked before any parsing."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_PROTOCOL_BYTES + 1)
    except OSError as err:
        raise RefusedError(f"{path}: cannot read protocol ({err.strerror}); check the path") from None
    if len(raw) > MAX_PROTOCOL_BYTES:
        raise RefusedError(f"{path}: larger than {MAX_PROTOCOL_BYTES} bytes (1 MiB); a protocol is a small YAML "
                           "file: check that this is the protocol")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise RefusedError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); "
                           "save the protocol as UTF-8") from None


def check_nodes(path: Path, root_node: yaml.Node) -> None:
    """Refuse duplicate mapping keys (naming the line of the repeat) and alias bombs, walking the node graph."""
    stack, visited = [root_node], 0
    while stack:
        node = stack.pop()
        visited += 1
        if visited > MAX_PROTOCOL_NODES:
            raise RefusedError(f"{path}: expands to more than {MAX_PROTOCOL_NODES} YAML nodes (through aliases); "
                               "write the protocol out without anchors and aliases")
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    name = (key.tag, str(key.value))
                    if name in first:
                        raise RefusedError(
                            f"{path}:{line_of(key)}: duplicate key {key.value!r} (first at line {first[name]}); "
                            "a frozen protocol gives each value once: remove one"
                        )
                    first[name] = line_of(key)
                stack += [key, value]
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value


def parse_yaml(path: Path, text: str) -> tuple[yaml.Node | None, Any]:
    """(root node, data) parsed once, with libyaml's C loader when this PyYAML has it."""
    loader = _LOADER(text)
    try:
        root_node = loader.get_single_node()
        if root_node is None:
            return None, None
        check_nodes(path, root_node)
        return root_node, loader.construct_document(root_node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise RefusedError(f"{path}:{line}: not valid YAML ({getattr(err, 'problem', err)}); fix the syntax") from None
    except RecursionError:
        raise RefusedError(f"{path}: YAML nested too deeply; a protocol is a small YAML file") from None
    except (ValueError, TypeError, OverflowError) as err:  # e.g. a date-like scalar that is no date
        raise RefusedError(f"{path}: a YAML value cannot be read ({err}); quote it or fix it") from None
    finally:
        loader.dispose()
