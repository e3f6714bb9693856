"""tuner.space: a contract suite over every file in search_spaces/, malformed files, config validation."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from tests.conftest import family_params, supported_archs, toy_space_text
from tuner.devices import DEVICE_MACROS, KNOWN_ARCHS, limits_for_arch
from tuner.paths import KERNEL_SRC
from tuner.problem import Problem
from tuner.space import ConfigError, SpaceError, available_families, config_key, load_space

# ---- the contract: every space file ---------------------------------------------------------------------------


def _problems(space, **shape):
    shape = {"batch": 2, "seqlen_q": 1024, "heads_q": 8, **shape}
    for dtype, head_dim, causal in itertools.product(space.family.dtypes, space.family.head_dims, (False, True)):
        yield Problem(dtype=dtype, head_dim=head_dim, causal=causal, **shape)


@pytest.fixture(params=family_params())
def space(request):
    return load_space(request.param)


def test_loads_by_name_and_path(space):
    assert space.name == space.path.stem
    assert space.name in available_families()
    assert load_space(space.name).family == space.family
    assert space.source_path.is_file()
    assert (KERNEL_SRC / space.family.config_header).is_file()
    assert space.knobs, "a family needs at least one knob"
    assert space.family.min_arch in KNOWN_ARCHS
    assert space.size() >= 2


def test_knob_declarations_are_sane(space):
    for k in space.knobs:
        assert k.default in k.values
        assert k.help.strip(), f"knob {k.name} has no help"
        assert all(isinstance(v, int) for v in k.values)
    macros = [k.macro for k in space.knobs] + [d.macro for d in space.derived if d.macro]
    assert len(set(macros)) == len(macros)


def test_default_is_statically_feasible_everywhere_it_must_run(space):
    archs = supported_archs(space)
    assert archs, f"{space.name}: no known arch at or above min_arch {space.family.min_arch}"
    failures = []
    for arch in archs:
        device = limits_for_arch(arch)
        for problem in _problems(space):
            reason = space.check(space.defaults(problem.head_dim, arch), problem, device)
            if reason:
                failures.append(f"sm_{arch} {problem.slug()}: {reason}")
    assert not failures, "\n".join(failures)


def test_older_arch_than_min_arch_is_infeasible(space):
    older = [a for a in KNOWN_ARCHS if a < space.family.min_arch]
    if not older:
        pytest.skip(f"{space.name} runs on every known arch")
    problem = next(_problems(space))
    reason = space.check(space.defaults(), problem, limits_for_arch(older[0]))
    assert reason and f"sm_{space.family.min_arch}" in reason


def test_a_family_runs_on_the_archs_its_build_allows(space):
    for arch in KNOWN_ARCHS:
        reason = space.runs_on(arch)
        if space.family.arch_suffix:  # arch-specific instructions: that arch only
            assert (reason is None) == (arch == space.family.min_arch), (arch, reason)
        else:
            assert (reason is None) == (arch >= space.family.min_arch), (arch, reason)
        assert reason is None or f"sm_{arch}" in reason
        problem = next(_problems(space))
        assert (
            space.check(space.defaults(problem.head_dim), problem, limits_for_arch(arch)) == reason
        ) or reason is None


def test_unsupported_head_dim_and_dtype_are_reported(space):
    odd = next(d for d in (96, 80, 160, 32, 256) if d not in space.family.head_dims)
    problem = Problem(batch=1, seqlen_q=128, heads_q=1, head_dim=odd)
    assert str(odd) in (space.supports(problem) or "")
    device = limits_for_arch(max(supported_archs(space)))
    assert space.check(space.defaults(), problem, device)


def test_macros_hold_problem_knob_and_derived_values(space):
    device = limits_for_arch(supported_archs(space)[0])
    for problem in _problems(space):
        macros = space.macros(space.defaults(problem.head_dim), problem, device)
        assert macros["FT_HEAD_DIM"] == problem.head_dim
        assert macros["FT_IS_BF16"] == int(problem.dtype == "bf16")
        assert macros["FT_IS_CAUSAL"] == int(problem.causal)
        for k in space.knobs:
            assert macros[k.macro] == k.default_for(problem.head_dim)
        env = space.environment(space.defaults(problem.head_dim), problem, device)
        for d in space.derived:
            if d.macro:
                assert macros[d.macro] == env[d.name]
        expected = 3 + len(space.knobs) + sum(1 for d in space.derived if d.macro)
        assert len(macros) == expected
        assert all(re.fullmatch(r"FT_[A-Z0-9_]+", m) for m in macros)
        assert all(isinstance(v, int) for v in macros.values())


def _one_cta_per_block(space, head_dim=None):
    """The default config, with a persistent grid (a family that has the knob) turned off."""
    config = space.defaults(head_dim)
    if "persistent" in config:
        config["persistent"] = 0
    return config


def test_launch_geometry_is_positive(space):
    for arch in supported_archs(space):
        device = limits_for_arch(arch)
        for problem in _problems(space):
            for config in (space.defaults(problem.head_dim), _one_cta_per_block(space, problem.head_dim)):
                g = space.launch(config, problem, device)
                assert len(g.grid) == 3 and all(isinstance(n, int) and n > 0 for n in g.grid), g
                assert 32 <= g.threads <= 1024 and g.threads % 32 == 0, g
                assert 0 <= g.smem_bytes <= device.smem_per_block_optin, g
            g = space.launch(_one_cta_per_block(space, problem.head_dim), problem, device)
            assert g.grid[1] == problem.heads_q and g.grid[2] == problem.batch  # README: y = head, z = batch


def test_a_persistent_grid_has_at_most_one_cta_per_sm_slot(space):
    if "persistent" not in space.defaults():
        pytest.skip(f"{space.name} has no persistent grid")
    device = limits_for_arch(supported_archs(space)[0])
    for problem in _problems(space):
        config = {**space.defaults(problem.head_dim), "persistent": 1}
        if space.check(config, problem, device) is not None:
            continue
        env = space.environment(config, problem, device)
        g = space.launch(config, problem, device)
        slots = device.num_sms * env.get("ctas_per_sm", 1) // env.get("cta_mode", 1) * env.get("cta_mode", 1)
        assert g.grid[1:] == (1, 1) and 1 <= g.grid[0] <= slots, g


def test_grid_covers_every_query_row(space):
    device = limits_for_arch(supported_archs(space)[0])
    problem = next(_problems(space))
    config = _one_cta_per_block(space)
    for seqlen_q in (1, 127, 128, 129, 4097):
        p = Problem(**{**problem.to_dict(), "seqlen_q": seqlen_q, "seqlen_k": seqlen_q})
        small = space.launch(config, p, device).grid[0]
        assert small >= 1
    grid_1 = space.launch(config, Problem(**{**problem.to_dict(), "seqlen_q": 1, "seqlen_k": 1}), device).grid[0]
    grid_big = space.launch(
        config, Problem(**{**problem.to_dict(), "seqlen_q": 65536, "seqlen_k": 65536}), device
    ).grid[0]
    assert grid_1 == 1 and grid_big > grid_1


def test_some_config_is_statically_infeasible_somewhere(space):
    """Constraints are not dead code: at least one point of the grid is refused for some supported problem."""
    archs = supported_archs(space)
    names = [k.name for k in space.knobs]
    problems = list(_problems(space))
    for values in itertools.product(*(k.values for k in space.knobs)):
        config = dict(zip(names, values))
        for arch in archs:
            if any(space.check(config, p, limits_for_arch(arch)) for p in problems[:: max(1, len(problems) // 4)]):
                return
    if space.constraints:
        pytest.fail(f"{space.name}: its constraints never reject a config")


def test_every_constraint_message_formats(space):
    """A refused config gets a readable reason naming its constraint; formatting never fails."""
    device = limits_for_arch(supported_archs(space)[0])
    names = [k.name for k in space.knobs]
    problem = next(_problems(space))
    seen = set()
    for values in itertools.islice(itertools.product(*(k.values for k in space.knobs)), 5000):
        for reason in space.violations(dict(zip(names, values)), problem, device):
            seen.add(reason.split(":", 1)[0])
            assert "{" not in reason, reason
    assert seen <= {c.name for c in space.constraints}


# ---- the config header reads exactly the space's macros ------------------------------------------------------

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def _header_macros(text: str) -> tuple[set[str], set[str], dict[str, str]]:
    """(macros given a default with #ifndef, FT_ macros the header's code uses, #ifndef default values)."""
    code = _COMMENT.sub("", text)
    guarded = set(re.findall(r"^\s*#\s*ifndef\s+(FT_[A-Z0-9_]+)", code, re.MULTILINE))
    defaults = dict(
        re.findall(r"^\s*#\s*ifndef\s+(FT_[A-Z0-9_]+)\s*\n\s*#\s*define\s+\1[ \t]+([^\n]*)", code, re.MULTILINE)
    )
    all_defined = set(re.findall(r"^\s*#\s*define\s+(FT_[A-Z0-9_]+)", code, re.MULTILINE))
    helpers = all_defined - guarded  # the header's own helper macros are not inputs
    used = set(re.findall(r"\bFT_[A-Z0-9_]+\b", code)) - helpers
    return guarded, used, defaults


def test_config_header_reads_exactly_the_space_macros(space):
    """Every problem, knob and derived macro, and of the device's (a build gets them all) those the header
    checks: each with a default for a build by hand, none that no build passes."""
    text = (KERNEL_SRC / space.family.config_header).read_text()
    guarded, used, _ = _header_macros(text)
    device_macros = set(DEVICE_MACROS.values())
    expected = (
        {"FT_HEAD_DIM", "FT_IS_BF16", "FT_IS_CAUSAL"}
        | {k.macro for k in space.knobs}
        | {d.macro for d in space.derived if d.macro}
    )
    checked = used & device_macros
    assert checked, f"{space.family.config_header} checks no device limit (FT_SMEM_PER_BLOCK_OPTIN, ...)"
    assert guarded == expected | checked, (
        f"#ifndef defaults: missing {sorted(expected | checked - guarded)}, "
        f"not in {space.name}.toml {sorted(guarded - expected - checked)}"
    )
    assert used == expected | checked, (
        f"header uses {sorted(used - expected - checked)} not declared in the space "
        f"file; never uses {sorted(expected - used)}"
    )


def test_a_build_gets_the_config_macros_and_the_device_limits(space):
    """``build_macros``: what the header defines for the config, then every limit the space checks it against."""
    device = limits_for_arch(supported_archs(space)[0])
    problem = next(_problems(space))
    config = space.defaults(problem.head_dim)
    build = space.build_macros(config, problem, device)
    assert build == {**space.macros(config, problem, device), **device.macros()}
    assert not set(space.macros(config, problem, device)) & set(device.macros())
    env = space.environment(config, problem, device)
    assert {build[macro] for macro in DEVICE_MACROS.values()} == {env[name] for name in DEVICE_MACROS}
    assert build["FT_SMEM_PER_BLOCK_OPTIN"] == device.smem_per_block_optin


def _header_default(value: str, head_dim: int) -> int | None:
    """A header default for ``head_dim``: a number, or ``(FT_HEAD_DIM == D ? A : B)`` (other forms: None)."""
    value = re.sub(r"\s*//.*", "", value).strip()
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    by_head_dim = re.fullmatch(r"\(FT_HEAD_DIM == (\d+) \? (-?\d+) : (-?\d+)\)", value)
    if by_head_dim:
        d, a, b = map(int, by_head_dim.groups())
        return a if head_dim == d else b
    return None


def _decides_the_tile_counter(space, knob: str) -> bool:
    """Whether the knob decides if the kernel takes the ABI's optional tile counter (``[launch.abi]
    tile_counter``: a null pointer where it is 0)."""
    return any(name == "tile_counter" and knob in expr.names for name, expr in space.launch_abi)


def test_config_header_defaults_equal_space_defaults(space):
    """A header's macro defaults are the space's, except a knob that decides whether the kernel reads the
    tile counter: its macro default is the value that reads none, since a space file without that knob
    (tests/data's sm90 spaces) passes a null pointer (tests/kernels/test_tile_counter_contract.py)."""
    _, _, defaults = _header_macros((KERNEL_SRC / space.family.config_header).read_text())
    mismatched = {}
    for k in space.knobs:
        assert _header_default(defaults.get(k.macro, ""), 0) is not None, f"{k.macro}: unreadable header default"
        for head_dim in space.family.head_dims:
            value = _header_default(defaults[k.macro], head_dim)
            expected = 0 if _decides_the_tile_counter(space, k.name) else k.default_for(head_dim)
            if value != expected:
                mismatched[f"{k.macro} d{head_dim}"] = (value, expected)
    assert not mismatched, f"header default vs space default: {mismatched}"


def test_header_parser_sees_mismatches():
    """The parser of the test above must notice a missing, an extra and an unused macro."""
    text = """
    // #ifndef FT_COMMENTED
    #ifndef FT_A
    #define FT_A 1
    #endif
    #ifndef FT_B
    #define FT_B 2
    #endif
    #define FT_HELPER(x) (x)
    constexpr int a = FT_HELPER(FT_A) + FT_B + FT_C;
    """
    guarded, used, defaults = _header_macros(text)
    assert guarded == {"FT_A", "FT_B"}
    assert used == {"FT_A", "FT_B", "FT_C"}
    assert defaults == {"FT_A": "1", "FT_B": "2"}


# ---- malformed space files --------------------------------------------------------------------------------------


def _write(tmp_path: Path, text: str, name: str = "toy") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def _drop_table(text: str, name: str) -> str:
    """Remove the table ``[name]`` (its header and its lines up to the next table)."""
    pattern = re.compile(r"^\[" + re.escape(name) + r"\]\n(?:(?!\[).*\n?)*", re.MULTILINE)
    assert pattern.search(text), name
    return pattern.sub("", text, count=1)


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def test_toy_space_is_valid(tmp_path):
    space = load_space(_write(tmp_path, toy_space_text()))
    assert [k.name for k in space.knobs] == ["block_m", "block_n", "stages", "flag"]
    assert [d.name for d in space.derived] == ["num_warps", "smem_bytes"]
    assert space.size() == 3 * 3 * 3 * 2


MALFORMED = {
    "missing_family": (lambda t: t.replace("[family]", "[familie]"), ["family"]),
    "unknown_key_in_knob": (
        lambda t: _replace(t, 'help = "keys per tile"', 'help = "keys per tile"\ndefualt = 64'),
        ["[knobs.block_n]", "defualt"],
    ),
    "typo_of_required_key": (
        lambda t: _replace(t, 'default = 64\nhelp = "keys', 'defualt = 64\nhelp = "keys'),
        ["[knobs.block_n]", "default"],
    ),
    "unknown_key_in_family": (lambda t: _replace(t, "description =", "descripton ="), ["[family]", "descripton"]),
    "unknown_top_level_table": (lambda t: t + '\n[constraint.x]\nexpr = "1"\nmessage = "m"\n', ["constraint"]),
    "empty_values": (lambda t: _replace(t, "values = [32, 64, 128]", "values = []"), ["[knobs.block_m]", "values"]),
    "default_not_in_values": (
        lambda t: _replace(t, "values = [32, 64, 128]", "values = [32, 128]"),
        ["[knobs.block_m]", "default"],
    ),
    "repeated_values": (
        lambda t: _replace(t, "values = [32, 64, 128]", "values = [32, 64, 64]"),
        ["[knobs.block_m]", "repeat"],
    ),
    "non_integer_values": (
        lambda t: _replace(t, "values = [32, 64, 128]", "values = [32, 64.0, 128]"),
        ["[knobs.block_m]", "integer"],
    ),
    "duplicate_macro": (
        lambda t: _replace(t, 'macro = "FT_BLOCK_N"', 'macro = "FT_BLOCK_M"'),
        ["[knobs.block_n]", "FT_BLOCK_M"],
    ),
    "macro_clashes_with_problem_macro": (
        lambda t: _replace(t, 'macro = "FT_KV_STAGES"', 'macro = "FT_HEAD_DIM"'),
        ["[knobs.stages]", "FT_HEAD_DIM"],
    ),
    "macro_clashes_with_device_macro": (
        lambda t: _replace(t, 'macro = "FT_KV_STAGES"', 'macro = "FT_SMEM_PER_SM"'),
        ["[knobs.stages]", "FT_SMEM_PER_SM"],
    ),
    "macro_not_ft": (
        lambda t: _replace(t, 'macro = "FT_BLOCK_N"', 'macro = "BLOCK_N"'),
        ["[knobs.block_n]", "BLOCK_N"],
    ),
    "macro_lower_case": (
        lambda t: _replace(t, 'macro = "FT_BLOCK_N"', 'macro = "FT_block_n"'),
        ["[knobs.block_n]", "FT_block_n"],
    ),
    "knob_name_not_snake_case": (lambda t: _replace(t, "[knobs.flag]", "[knobs.Flag]"), ["[knobs.Flag]"]),
    "knob_shadows_problem_field": (lambda t: _replace(t, "[knobs.flag]", "[knobs.head_dim]"), ["[knobs.head_dim]"]),
    "knob_not_a_table": (lambda t: _drop_table(t, "knobs.flag") + "\n[knobs]\nflag = 3\n", ["flag", "table"]),
    "constraint_uses_missing_knob": (
        lambda t: t + '\n[constraints.c]\nexpr = "block_k <= 64"\nmessage = "m"\n',
        ["[constraints.c]", "block_k"],
    ),
    "derived_uses_later_name": (
        lambda t: _replace(t, 'expr = "block_m // 16"', 'expr = "smem_bytes // 16"'),
        ["[derived.num_warps]", "smem_bytes"],
    ),
    "derived_uses_disallowed_syntax": (
        lambda t: _replace(t, 'expr = "block_m // 16"', 'expr = "block_m / 16"'),
        ["[derived.num_warps]", "Div"],
    ),
    "message_uses_unknown_field": (
        lambda t: _replace(t, "the device allows {smem_per_block_optin} B", "the device allows {smem_limit} B"),
        ["[constraints.smem_fits]", "smem_limit"],
    ),
    "message_with_positional_field": (
        lambda t: _replace(t, "the device allows {smem_per_block_optin} B", "the device allows {} B"),
        ["[constraints.smem_fits]", "not a valid format string"],
    ),
    "message_with_bad_format_spec": (
        lambda t: _replace(
            t, "the device allows {smem_per_block_optin} B", "the device allows {smem_per_block_optin:q} B"
        ),
        ["[constraints.smem_fits]", "not a valid format string"],
    ),
    "constraint_without_message": (
        lambda t: _replace(t, 'message = "needs', 'mesage = "needs'),
        ["[constraints.smem_fits]", "message"],
    ),
    "launch_uses_unknown_name": (
        lambda t: _replace(t, 'threads = "num_warps * 32"', 'threads = "warps * 32"'),
        ["[launch]", "warps"],
    ),
    "launch_grid_of_two": (lambda t: _replace(t, '"heads_q", "batch"]', '"heads_q"]'), ["[launch]", "grid"]),
    "launch_abi_uses_unknown_name": (
        lambda t: _replace(t, '"heads_q", "batch"]', '"heads_q", "batch"]\nabi = { rows = "block_q" }'),
        ["[launch.abi] rows", "block_q"],
    ),
    "launch_abi_not_a_table": (
        lambda t: _replace(t, '"heads_q", "batch"]', '"heads_q", "batch"]\nabi = 3'),
        ["[launch]", "abi must be a table"],
    ),
    "head_dim_default_for_unsupported_head_dim": (
        lambda t: _replace(t, 'help = "keys per tile"', 'help = "keys per tile"\ndefault_by_head_dim = { 256 = 32 }'),
        ["[knobs.block_n]", "'256'", "head_dims [64, 128]"],
    ),
    "head_dim_default_not_in_values": (
        lambda t: _replace(t, 'help = "keys per tile"', 'help = "keys per tile"\ndefault_by_head_dim = { 128 = 48 }'),
        ["[knobs.block_n]", "128 = 48", "values"],
    ),
    "head_dim_defaults_not_a_table": (
        lambda t: _replace(t, 'help = "keys per tile"', 'help = "keys per tile"\ndefault_by_head_dim = 32'),
        ["[knobs.block_n]", "default_by_head_dim must be a table"],
    ),
    "arch_default_not_above_min_arch": (
        lambda t: _replace(t, 'help = "keys per tile"', 'help = "keys per tile"\ndefault_by_arch = { 80 = 32 }'),
        ["[knobs.block_n]", "'80'", "above the family's min_arch 80"],
    ),
    "arch_default_not_in_values": (
        lambda t: _replace(t, 'help = "keys per tile"', 'help = "keys per tile"\ndefault_by_arch = { 100 = 48 }'),
        ["[knobs.block_n]", "100 = 48", "values"],
    ),
    "arch_defaults_not_a_table": (
        lambda t: _replace(t, 'help = "keys per tile"', 'help = "keys per tile"\ndefault_by_arch = 32'),
        ["[knobs.block_n]", "default_by_arch must be a table"],
    ),
    "default_rule_reads_an_unknown_name": (
        lambda t: t + '\n[[defaults]]\nwhen = "block_rows == 64"\nset = { stages = 3 }\nhelp = "h"\n',
        ["[[defaults]] #1", "block_rows", "no name of the problem, the device, a knob or a derived value"],
    ),
    "default_rule_sets_no_knob": (
        lambda t: t + '\n[[defaults]]\nwhen = "causal"\nset = { depth = 3 }\nhelp = "h"\n',
        ["[[defaults]] #1", "'depth'", "not a knob"],
    ),
    "default_rule_value_not_allowed": (
        lambda t: t + '\n[[defaults]]\nwhen = "causal"\nset = { stages = 5 }\nhelp = "h"\n',
        ["[[defaults]] #1", "stages = 5", "values"],
    ),
    "default_rule_without_help": (
        lambda t: t + '\n[[defaults]]\nwhen = "causal"\nset = { stages = 3 }\nhelp = " "\n',
        ["[[defaults]] #1", "help"],
    ),
    "default_rule_bad_expression": (
        lambda t: t + '\n[[defaults]]\nwhen = "causal and"\nset = { stages = 3 }\nhelp = "h"\n',
        ["[[defaults]] #1", "when"],
    ),
    "defaults_not_an_array": (lambda t: t + '\n[defaults]\nwhen = "causal"\n', ["defaults must be an array"]),
    "invalid_toml": (lambda t: t + "\n[knobs.x\n", ["TOML"]),
    "name_not_stem": (lambda t: _replace(t, 'name = "toy"', 'name = "toy2"'), ["toy2", "toy"]),
    "source_missing": (
        lambda t: re.sub(r'source = "[^"]+"', 'source = "nope/flash_fwd.cu"', t, count=1),
        ["[family]", "nope/flash_fwd.cu"],
    ),
    "bad_dtype": (
        lambda t: _replace(t, 'dtypes = ["fp16", "bf16"]', 'dtypes = ["fp16", "fp8"]'),
        ["[family]", "dtypes"],
    ),
    "no_head_dims": (lambda t: _replace(t, "head_dims = [64, 128]", "head_dims = []"), ["[family]", "head_dims"]),
    "no_knobs": (
        lambda t: (
            _drop_table(
                _drop_table(_drop_table(_drop_table(t, "knobs.block_m"), "knobs.block_n"), "knobs.stages"), "knobs.flag"
            )
            + "\n[knobs]\n"
        ),
        ["[knobs]"],
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_space_file_raises_space_error_naming_file_and_entry(tmp_path, case):
    mutate, fragments = MALFORMED[case]
    text = mutate(toy_space_text())
    assert text != toy_space_text()
    path = _write(tmp_path, text)
    with pytest.raises(SpaceError) as info:
        load_space(path)
    message = str(info.value)
    assert str(path) in message, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "\n" not in message.split(": not valid TOML:")[0]


def test_unknown_family_name_lists_available():
    with pytest.raises(SpaceError, match="unknown kernel family 'no_such_family'"):
        load_space("no_such_family")


def test_missing_space_file_path(tmp_path):
    with pytest.raises(SpaceError, match="no such space file"):
        load_space(tmp_path / "absent.toml")


# ---- configs ------------------------------------------------------------------------------------------------


def test_validate_canonicalizes_order_and_type(toy_space):
    config = toy_space.validate({"flag": 1, "stages": 3, "block_n": 32, "block_m": 128.0})
    assert config == {"block_m": 128, "block_n": 32, "stages": 3, "flag": 1}
    assert list(config) == ["block_m", "block_n", "stages", "flag"]
    assert all(type(v) is int for v in config.values())


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"block_m": 64, "block_n": 64, "stages": 2, "flag": 0, "block_k": 32}, "unknown knob.*block_k"),
        ({"block_m": 64, "block_n": 64, "stages": 2}, "no value for knob 'flag'"),
        ({"block_m": 96, "block_n": 64, "stages": 2, "flag": 0}, r"block_m=96 is not one of \[32, 64, 128\]"),
        ({"block_m": 64, "block_n": 64, "stages": 2, "flag": True}, "flag must be an integer"),
        ({"block_m": 64, "block_n": 64, "stages": 2, "flag": False}, "flag must be an integer"),
        ({"block_m": 64.5, "block_n": 64, "stages": 2, "flag": 0}, "block_m must be an integer"),
        ({"block_m": "64", "block_n": 64, "stages": 2, "flag": 0}, "block_m must be an integer"),
        ({"block_m": None, "block_n": 64, "stages": 2, "flag": 0}, "block_m must be an integer"),
    ],
)
def test_validate_refuses_bad_configs(toy_space, config, match):
    with pytest.raises(ConfigError, match=match):
        toy_space.validate(config)


def test_partial_fills_defaults(toy_space):
    assert toy_space.validate({"block_n": 128}, partial=True) == {"block_m": 64, "block_n": 128, "stages": 2, "flag": 0}
    assert toy_space.validate({}, partial=True) == toy_space.defaults()
    with pytest.raises(ConfigError):
        toy_space.validate({"block_n": 100}, partial=True)
    with pytest.raises(ConfigError):
        toy_space.validate({"nope": 1}, partial=True)


def test_a_head_dim_can_have_its_own_default(tmp_path):
    text = _replace(
        toy_space_text(), 'help = "keys per tile"', 'help = "keys per tile"\ndefault_by_head_dim = { 128 = 32 }'
    )
    space = load_space(_write(tmp_path, text))
    plain = {"block_m": 64, "block_n": 64, "stages": 2, "flag": 0}
    assert space.defaults() == space.defaults(64) == plain
    assert space.defaults(128) == {**plain, "block_n": 32}
    assert space.knob("block_n").default_for(128) == 32 and space.knob("block_n").default_for(None) == 64
    assert space.validate({"stages": 3}, partial=True, head_dim=128) == {**plain, "block_n": 32, "stages": 3}
    assert space.validate({"block_n": 128}, partial=True, head_dim=128)["block_n"] == 128  # given values win


def test_an_arch_can_have_its_own_default_from_that_arch_on(tmp_path):
    text = _replace(
        toy_space_text(),
        'help = "keys per tile"',
        'help = "keys per tile"\ndefault_by_head_dim = { 128 = 128 }\ndefault_by_arch = { 100 = 32, 120 = 128 }',
    )
    space = load_space(_write(tmp_path, text))
    plain = {"block_m": 64, "block_n": 64, "stages": 2, "flag": 0}
    assert space.defaults(64) == space.defaults(64, 80) == space.defaults(64, 90) == plain
    assert space.defaults(128, 90)["block_n"] == 128  # below every arch key: the head dim's default
    assert space.defaults(64, 100) == space.defaults(128, 103) == {**plain, "block_n": 32}  # the arch's wins
    assert space.defaults(64, 120)["block_n"] == 128  # the highest key at or below the arch
    assert space.knob("block_n").default_for(None, 110) == 32


def test_default_rules_apply_in_order_for_the_problem_and_device_only(tmp_path, sm80):
    """[[defaults]]: where a rule's condition on the problem and the device holds, its knobs default to its
    values (a later rule wins); without a problem and a device the plain defaults stay."""
    text = toy_space_text() + (
        '\n[[defaults]]\nwhen = "causal and seqlen_q >= 4096"\nset = { stages = 3, block_n = 128 }\nhelp = "long causal"\n'
        '\n[[defaults]]\nwhen = "ceil_div(seqlen_q, 64) * heads_q * batch < num_sms"\nset = { block_m = 32 }\n'
        'help = "fewer query blocks than SMs: smaller ones"\n'
        '\n[[defaults]]\nwhen = "causal and seqlen_q >= 16384"\nset = { block_n = 32 }\nhelp = "later wins"\n'
    )
    space = load_space(_write(tmp_path, text))
    plain = space.defaults(64)
    assert [r.help for r in space.default_rules] == [
        "long causal",
        "fewer query blocks than SMs: smaller ones",
        "later wins",
    ]

    def default(**kw):
        return space.defaults(problem=Problem(**{"batch": 4, "heads_q": 16, "head_dim": 64, **kw}), device=sm80)

    assert default(seqlen_q=2048, causal=True) == plain
    assert default(seqlen_q=4096, causal=True) == {**plain, "stages": 3, "block_n": 128}
    assert default(seqlen_q=16384, causal=True) == {**plain, "stages": 3, "block_n": 32}
    assert default(seqlen_q=64, batch=1) == {**plain, "block_m": 32}  # 16 query blocks, 108 SMs
    assert space.defaults(64, 80) == plain  # no problem, no rule


def test_a_default_rule_reads_the_config_the_earlier_rules_left(tmp_path, sm80):
    """A rule's ``when`` may read knobs and derived values: those of the defaults after the rules above it."""
    taller = '\n[[defaults]]\nwhen = "batch == 1"\nset = { block_m = 128 }\nhelp = "one sequence: taller tiles"\n'
    deeper = (
        '\n[[defaults]]\nwhen = "num_warps == 8 and smem_bytes <= LIMIT"\nset = { stages = 3 }\n'
        'help = "8 warps with shared memory to spare: a deeper ring"\n'
    )
    plain = load_space(_write(tmp_path, toy_space_text())).defaults(64)

    def default(text: str, batch: int) -> dict:
        space = load_space(_write(tmp_path, text))
        return space.defaults(problem=Problem(batch=batch, heads_q=16, seqlen_q=1024, head_dim=64), device=sm80)

    text = toy_space_text() + taller + deeper.replace("LIMIT", "50000")
    assert [r.reads_config for r in load_space(_write(tmp_path, text)).default_rules] == [False, True]
    assert default(text, 4) == plain  # block_m 64: 4 warps
    # the first rule leaves 128 rows: 8 warps and (128 + 2*2*64) * 64 * 2 = 49152 B of shared memory
    assert default(text, 1) == {**plain, "block_m": 128, "stages": 3}
    assert default(toy_space_text() + taller + deeper.replace("LIMIT", "40000"), 1) == {**plain, "block_m": 128}
    # in the other order the ring's rule sees the plain 64 rows (4 warps) and does not hold
    assert default(toy_space_text() + deeper.replace("LIMIT", "50000") + taller, 1) == {**plain, "block_m": 128}


def test_knob_lookup(toy_space):
    assert toy_space.knob("stages").macro == "FT_KV_STAGES"
    with pytest.raises(ConfigError, match="unknown knob 'x'"):
        toy_space.knob("x")


def test_violations_name_constraint_and_values(toy_space, problem, sm80):
    big = {"block_m": 128, "block_n": 128, "stages": 3, "flag": 0}
    reasons = toy_space.violations(big, problem, sm80)
    smem = (128 + 2 * 3 * 128) * 128 * 2
    assert reasons == [f"smem_fits: needs {smem} B of shared memory; the device allows {sm80.smem_per_block_optin} B"]
    assert toy_space.check(big, problem, sm80) == reasons[0]
    assert toy_space.check(toy_space.defaults(), problem, sm80) is None
    # the same config fits the larger shared memory of sm_90 at d64
    small_d = Problem(batch=1, seqlen_q=64, heads_q=1, head_dim=64)
    assert toy_space.check(big, small_d, limits_for_arch(90)) is None


def test_violations_for_unsupported_problem_and_old_arch(toy_space, sm80):
    p96 = Problem(batch=1, seqlen_q=64, heads_q=1, head_dim=96)
    assert toy_space.violations(toy_space.defaults(), p96, sm80) == ["toy supports head dims [64, 128], not 96"]
    old = sm80.__class__(arch=75, smem_per_block_optin=65536, num_sms=40)
    p = Problem(batch=1, seqlen_q=64, heads_q=1, head_dim=64)
    assert "needs sm_80 or newer" in toy_space.check(toy_space.defaults(), p, old)


def test_violations_validate_the_config(toy_space, problem, sm80):
    with pytest.raises(ConfigError):
        toy_space.check({"block_m": 7, "block_n": 64, "stages": 2, "flag": 0}, problem, sm80)


def test_environment_and_macros(toy_space, problem, sm80):
    config = {"block_m": 128, "block_n": 32, "stages": 1, "flag": 1}
    env = toy_space.environment(config, problem, sm80)
    assert env["num_warps"] == 8
    assert env["smem_bytes"] == (128 + 2 * 32) * 128 * 2
    assert env["smem_per_block_optin"] == sm80.smem_per_block_optin and env["seqlen_q"] == problem.seqlen_q
    assert toy_space.macros(config, problem, sm80) == {
        "FT_HEAD_DIM": 128,
        "FT_IS_BF16": 0,
        "FT_IS_CAUSAL": 0,
        "FT_BLOCK_M": 128,
        "FT_BLOCK_N": 32,
        "FT_KV_STAGES": 1,
        "FT_Q_IN_REGS": 1,
        "FT_SMEM_BYTES": 49152,
    }


def test_launch(toy_space, sm80):
    p = Problem(batch=3, seqlen_q=1000, heads_q=5, head_dim=64)
    g = toy_space.launch({"block_m": 128, "block_n": 32, "stages": 1, "flag": 0}, p, sm80)
    assert g.grid == (8, 5, 3)
    assert g.threads == 256
    assert g.smem_bytes == (128 + 64) * 64 * 2
    assert g.abi == {}


def test_launch_abi_values_for_the_argument_builder(tmp_path, sm80):
    text = toy_space_text().replace(
        '"heads_q", "batch"]', '"heads_q", "batch"]\nabi = { rows = "block_n // 2", one = "1" }'
    )
    space = load_space(_write(tmp_path, text))
    g = space.launch(
        {"block_m": 128, "block_n": 32, "stages": 1, "flag": 0},
        Problem(batch=1, seqlen_q=9, heads_q=1, head_dim=64),
        sm80,
    )
    assert g.abi == {"rows": 16, "one": 1}


def test_no_python_module_spells_a_knob_name_or_macro():
    """One source of truth: knobs are named in their space file (and read by config.cuh) only."""
    import pathlib

    import tuner

    names = {n for family in ("sm80", "sm90") for k in load_space(family).knobs for n in (k.name, k.macro)}
    found = [
        (str(p), n)
        for p in pathlib.Path(tuner.__file__).parent.rglob("*.py")
        for n in names
        if re.search(rf"[\"']{re.escape(n)}[\"']", p.read_text())
    ]
    assert not found


def test_arch_string(toy_space, tmp_path):
    assert toy_space.arch_string(80) == "80"
    text = _replace(toy_space_text(), "min_arch = 80", 'min_arch = 90\narch_suffix = "a"')
    assert load_space(_write(tmp_path, text)).arch_string(90) == "90a"


def test_config_key_is_stable_and_order_independent():
    a = config_key({"block_m": 64, "block_n": 32})
    assert a == config_key({"block_n": 32, "block_m": 64})
    assert a != config_key({"block_m": 64, "block_n": 64})
    assert a != config_key({"block_m": 32, "block_n": 64})
    assert len(a) == 16 and re.fullmatch(r"[0-9a-f]+", a)


def test_config_key_is_stable_across_processes():
    import subprocess
    import sys

    code = "from tuner.space import config_key; print(config_key({'block_n': 32, 'block_m': 64}))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin"},
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == config_key({"block_m": 64, "block_n": 32})


@pytest.mark.parametrize("family", family_params())
def test_the_default_of_every_problem_is_feasible(family):
    """The default a study starts from (head dim, arch and [[defaults]] rules for the problem and device) passes
    the static check, for problems across batch, lengths, head counts, GQA, masks and dtypes."""
    import random

    space = load_space(family)
    rng = random.Random(7)
    for arch in supported_archs(space):
        device = limits_for_arch(arch)
        for _ in range(150):
            heads = rng.choice([1, 8, 12, 16, 20, 24, 28, 32, 64])
            problem = Problem(
                batch=rng.choice([1, 2, 4, 8, 32, 128]),
                seqlen_q=rng.choice([1, 77, 257, 512, 577, 1500, 2048, 4096, 4429, 8192, 16384]),
                heads_q=heads,
                heads_kv=rng.choice([d for d in (1, 2, 4, 8, heads) if heads % d == 0]),
                head_dim=rng.choice(space.family.head_dims),
                dtype=rng.choice(space.family.dtypes),
                causal=rng.random() < 0.5,
            )
            config = space.defaults(problem=problem, device=device)
            assert space.check(config, problem, device) is None, (problem, config)


@pytest.mark.parametrize("family", family_params())
def test_feasible_agrees_with_check_on_random_configs(family):
    """Space.feasible (first failing constraint, derived values computed when read) says what check says: on
    random configs of the whole grid, mostly infeasible, at every head dim, masked or not, on every arch."""
    import random

    space = load_space(family)
    rng = random.Random(0)
    for arch in supported_archs(space):
        device = limits_for_arch(arch)
        for head_dim, causal in itertools.product(space.family.head_dims, (False, True)):
            problem = Problem(batch=2, seqlen_q=1000, heads_q=8, head_dim=head_dim, causal=causal, heads_kv=2)
            configs = [{k.name: rng.choice(k.values) for k in space.knobs} for _ in range(300)]
            configs.append(space.defaults(problem=problem, device=device))
            verdicts = [space.feasible(c, problem, device) for c in configs]
            assert verdicts == [space.check(c, problem, device) is None for c in configs]
            assert any(verdicts)  # the default at least
    too_long = Problem(batch=2**20, seqlen_q=2**20, heads_q=2**10, head_dim=space.family.head_dims[0])
    device = limits_for_arch(supported_archs(space)[0])
    config = space.defaults(too_long.head_dim)
    assert space.feasible(config, too_long, device) == (space.check(config, too_long, device) is None)
