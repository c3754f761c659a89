"""Facts a plugin owns: its section of a host's facts (``gpudask_facts_sections``), probed on
a real host, read from a described host's ``{"sections": {name: value}}`` (absent: None);
validated with the plugin's JSON Schema fragment and its ``check`` (one line naming the file or
the probe, the key path and the ``x-accepts`` text); read with ``ctx.facts.section(name)``.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpudask import session
from gpudask.errors import FactsError, PluginError
from gpudask.facts.loader import _fail, _key, remembered_error

if TYPE_CHECKING:
    from gpudask.facts.model import Facts


@dataclass(frozen=True)
class FactsSection:
    """A section of a host's facts owned by one plugin (``facts.section(name)``).

    ``schema``: a JSON Schema (draft 2020-12) fragment for the value; its ``x-accepts`` texts
    are what the one-line errors say is accepted.  ``probe(facts)``: the value on this host,
    from the core's facts (on a real host only, once per process; no CUDA context).

    Optional: ``check(value, facts)``, what the schema cannot say: None, or ``(key path inside
    the section, what is accepted, the value found)`` for the first problem; ``summary(value)``,
    a few words for the host line of ``gpudask info``, or None (``value`` None when a described
    host does not say); ``decides=False`` for a section no plan decision depends on: probed and
    validated when first read, not in every process that reads facts.
    """

    name: str
    schema: Mapping[str, Any]
    probe: Callable[[Facts], Any]
    check: Callable[[Any, Facts], tuple[Sequence[str | int], str, Any] | None] | None = None
    summary: Callable[[Any], str | None] | None = None
    decides: bool = True


# gpudask.plugin.registration.BUILTIN_DISTRIBUTION: that module is of a later stage
_BUILTIN_DISTRIBUTION = "gpudask"


def check_declared(plugin: str, distribution: str | None, result: Any, taken: Mapping[str, str]) -> list[FactsSection]:
    """A plugin's ``gpudask_facts_sections`` result, checked: FactsSections with names of their
    own (``taken``: name -> the plugin that has it) and valid JSON Schemas."""
    hook = "gpudask_facts_sections"
    out: list[FactsSection] = []
    for section in result or []:
        if not isinstance(section, FactsSection) or not isinstance(section.name, str) or not section.name \
                or not isinstance(section.schema, Mapping) or not callable(section.probe) \
                or not all(f is None or callable(f) for f in (section.check, section.summary)) \
                or not isinstance(section.decides, bool):
            raise PluginError(plugin, distribution, hook, f"returned {section!r:.80}; expected "
                              "gpudask.pluginapi.FactsSection(name, schema, probe) with a JSON Schema mapping "
                              "(check, summary: callables or None; decides: a bool)")
        if section.name in taken:
            raise PluginError(plugin, distribution, hook, f"facts section {section.name!r} is plugin "
                              f"{taken[section.name]!r}'s; accepted: a section name of its own")
        # the built-in plugins' schemas are checked by the test suite (tests/test_facts_sections.py),
        # not again at every start: the meta-schema check is a planning process's costliest step
        if distribution != _BUILTIN_DISTRIBUTION:
            import jsonschema

            try:
                jsonschema.Draft202012Validator.check_schema(dict(section.schema))
            except jsonschema.SchemaError as e:
                raise PluginError(plugin, distribution, hook, f"facts section {section.name!r}: its schema is not "
                                  f"valid JSON Schema: {' '.join(str(e.message).split())[:200]}") from None
        out.append(section)
    return out


def _probed(plugin: str, section: FactsSection, facts: Facts) -> Any:
    """The section probed once per process per (name, probe, the host's core facts), as the
    core's own probe (the process state's ``probed_sections``)."""
    probed = session.current().probed_sections
    key = (section.name, section.probe, facts.hostname, tuple((g.index, g.uuid, g.pci_bus_id) for g in facts.gpus),
           tuple(sorted(facts.packages.items())))
    if key not in probed:
        try:
            probed[key] = section.probe(facts)
        except FactsError:
            raise
        except Exception as e:  # noqa: BLE001 - a probe's failure names its plugin
            raise PluginError(plugin, None, f"the probe of facts section {section.name!r}", e) from e
    return copy.deepcopy(probed[key])


def with_sections(facts: Facts, declared: Iterable[tuple[str, FactsSection]]) -> Facts:
    """``facts`` with every declared section, taken from the facts (a file, or a planning
    parent's) or probed on a real host, and validated."""
    sections = dict(facts.sections)
    deferred: dict[str, Callable[[], Any]] = {}
    for plugin, section in declared:
        if section.name in sections:
            _raise_if_invalid(facts, plugin, section, sections[section.name])
        elif facts.described:
            continue  # the file does not describe it: None for the plugin
        elif section.decides:
            sections[section.name] = _probe_and_check(plugin, section, facts)
        else:  # probed when read (facts.section), in the process that reads it
            deferred[section.name] = functools.partial(_probe_and_check, plugin, section, facts)
    if sections == facts.sections and not deferred:
        return facts
    return replace(facts, sections=sections, deferred=deferred)


def _raise_if_invalid(facts: Facts, plugin: str, section: FactsSection, value: Any) -> None:
    error = section_error(facts.where(), section, value, plugin)
    if error is not None:
        raise error
    if section.check is None:
        return
    try:
        found = section.check(value, facts)
    except Exception as e:  # noqa: BLE001 - a check's failure names its plugin
        raise PluginError(plugin, None, f"the check of facts section {section.name!r}", e) from e
    if found is not None:
        path, accepted, got = found
        raise FactsError(f"{_fail(facts.where(), _key(['sections', section.name, *path]), accepted, got)} "
                         f"(facts section of plugin {plugin!r})")


def _probe_and_check(plugin: str, section: FactsSection, facts: Facts) -> Any:
    value = _probed(plugin, section, facts)
    _raise_if_invalid(facts, plugin, section, value)
    return value


def summaries(facts: Facts, declared: Iterable[tuple[str, FactsSection]]) -> list[str]:
    """The declared sections' few words for the host line of ``gpudask info`` (``summary``)."""
    out = []
    for plugin, section in declared:
        if section.summary is not None:
            try:
                text = section.summary(facts.section(section.name))
            except Exception as e:  # noqa: BLE001 - a summary's failure names its plugin
                raise PluginError(plugin, None, f"the summary of facts section {section.name!r}", e) from e
            if text:
                out.append(str(text))
    return out


def section_error(where: str, section: FactsSection, value: Any, plugin: str) -> FactsError | None:
    """The first place ``value`` leaves the section's schema, as one line, or None."""
    error = remembered_error(dict(section.schema), value, where, ["sections", section.name])
    return None if error is None else FactsError(f"{error} (facts section of plugin {plugin!r})")
