"""The one YAML reader for every file yolotrain reads: dataset YAMLs, ``--config``, ``--hyp``, model YAMLs.

PyYAML's safe loader (plain data only: a tag that would construct an object is an error), with the
checks a settings file needs and YAML itself does not make:

- a key given twice in one mapping is an error naming both lines (YAML would keep the last silently);
- aliases are followed, but the document they expand to is bounded (:data:`MAX_YAML_VALUES`): a
  kilobyte "billion laughs" file is refused in one line before anything walks it, and an alias that
  contains itself is refused too;
- files larger than :data:`MAX_YAML_BYTES` are not parsed.

Every failure is one :class:`YamlError` line ``FILE:LINE: ...`` (the line where YAML knows it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from .messages import brief

# Settings, dataset and model YAMLs are kilobytes; image lists belong in .txt files.
MAX_YAML_BYTES = 16 << 20
# Values (scalars, lists, mappings) a document may expand to once its aliases are followed.
MAX_YAML_VALUES = 1_000_000
_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlError(ValueError):
    """A YAML file that cannot be read as plain, bounded data; the message names the file and line."""


def read_yaml_document(path: str | os.PathLike) -> tuple[Any, yaml.Node | None]:
    """The data of a YAML file and its node tree (for line numbers); None for an empty file.

    Raises:
        FileNotFoundError: no such file.
        YamlError: too large, not text, not valid YAML, a duplicate key, or aliases that expand past
            :data:`MAX_YAML_VALUES` values.
    """
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise YamlError(f"{path}: {size} bytes, more than a YAML file read here may hold ({MAX_YAML_BYTES})")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise YamlError(f"{path}: not a text file") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        _check_graph(node, loader, path)
        return loader.construct_document(node), node
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise YamlError(f"{path}{where}: not valid YAML ({problem})") from None
    except RecursionError:
        raise YamlError(f"{path}: not valid YAML (nested too deeply)") from None
    finally:
        loader.dispose()


def read_yaml(path: str | os.PathLike) -> Any:
    """The data of a YAML file (None when empty); see :func:`read_yaml_document`."""
    return read_yaml_document(path)[0]


def _check_graph(root: yaml.Node, loader: yaml.SafeLoader, path: Path) -> None:
    """Refuse repeated keys, and count the values the document expands to (each alias as often as it
    is used) without expanding it.

    Aliases make the composed document a graph whose nodes are shared: the expanded size of a node
    is one plus that of its children, computed once per node, so a bomb is measured in time linear
    in its (small) file. A node reached again while its own size is being counted contains itself.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        children = _children(node)
        if children_done:
            open_nodes.discard(key)
            sizes[key] = min(1 + sum(sizes[id(child)] for child in children), MAX_YAML_VALUES + 1)
            if sizes[key] > MAX_YAML_VALUES:
                raise YamlError(f"{path}:{node.start_mark.line + 1}: its aliases expand to more than "
                                f"{MAX_YAML_VALUES} values (refused: such a file is built to exhaust memory)")
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise YamlError(f"{path}:{node.start_mark.line + 1}: an alias refers to a value that contains it")
        open_nodes.add(key)
        if isinstance(node, yaml.MappingNode):
            _check_unique_keys(node, loader, path)
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)


def _check_unique_keys(node: yaml.MappingNode, loader: yaml.SafeLoader, path: Path) -> None:
    """A key given twice in one mapping (keys compared as values: ``1`` and ``0x1`` are the same key)."""
    first_lines: dict[Any, int] = {}
    for key_node, _ in node.value:
        # "<<: *base" entries may be overridden (that is their use); keys that are lists or mappings
        # are left to the constructor, which refuses the unhashable ones.
        if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = loader.construct_object(key_node)
        if key in first_lines:
            raise YamlError(f"{path}:{key_node.start_mark.line + 1}: duplicate key {brief(key)} "
                            f"(first given on line {first_lines[key]})")
        first_lines[key] = key_node.start_mark.line + 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [item for pair in node.value for item in pair]
    return []
