"""Kernel directories of the user's own (``--kernels DIR``, ``$FLASHTUNE_KERNELS``, ``kernels=``): families
found by name before the package's, sources relative to their directory under the same rules as kernel_src/
(no "..", no link out, bounded sizes, macros read by the kernel), and a digest of exactly the sources a
family compiles. No GPU, no nvcc."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tuner.paths import KERNEL_SRC, REPO_ROOT
from tuner.space import KERNELS_ENV, SpaceError, available_families, kernel_dirs, load_space

EXAMPLE = (REPO_ROOT or Path(__file__).resolve().parents[2]) / "examples" / "my_kernel"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(KERNELS_ENV, raising=False)


@pytest.fixture
def kdir(tmp_path) -> Path:
    """A copy of the worked example's kernel directory, to change."""
    target = tmp_path / "kernels"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns("*.md", "*.h", "*.json"))
    return target


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_a_family_is_found_by_name_in_a_kernel_directory(kdir):
    space = load_space("my_fa", kernels=kdir)
    assert space.root == kdir.resolve() and space.origin == str(kdir.resolve())
    assert space.source_path == kdir.resolve() / "my_fa" / "flash_fwd.cu"
    assert space.path == kdir.resolve() / "my_fa.toml"
    assert "my_fa" in available_families(kdir) and "sm80" in available_families(kdir)
    assert "my_fa" not in available_families()
    assert load_space("sm80", kernels=kdir).origin == "package"  # the package's families stay found


def test_the_environment_names_kernel_directories_as_a_path_list(kdir, tmp_path, monkeypatch):
    other = tmp_path / "empty"
    other.mkdir()
    monkeypatch.setenv(KERNELS_ENV, os.pathsep.join([str(other), str(kdir)]))
    assert load_space("my_fa").root == kdir.resolve()
    assert kernel_dirs() == (other.resolve(), kdir.resolve())
    # a space file given by its path, in a directory the environment names, has its sources there
    assert load_space(kdir / "my_fa.toml").root == kdir.resolve()


def test_an_unknown_family_names_where_it_was_looked_for(kdir):
    with pytest.raises(SpaceError, match=r"unknown kernel family 'nope'.*my_fa.*--kernels DIR"):
        load_space("nope", kernels=kdir)


def test_a_kernel_directory_that_is_not_one_is_refused(tmp_path, monkeypatch):
    with pytest.raises(SpaceError, match="is not a directory"):
        load_space("sm80", kernels=tmp_path / "missing")
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(KERNELS_ENV, str(tmp_path / "file"))
    with pytest.raises(SpaceError, match=f"{KERNELS_ENV}: .* is not a directory"):
        load_space("sm80")


def test_a_name_defined_in_the_package_and_a_kernel_directory_is_refused_unless_the_path_is_given(kdir):
    (kdir / "my_fa.toml").rename(kdir / "sm80.toml")
    _edit(kdir / "sm80.toml", 'name = "my_fa"', 'name = "sm80"')
    with pytest.raises(SpaceError, match=r"'sm80' is defined twice .*give the space file's path"):
        load_space("sm80", kernels=kdir)
    mine = load_space(kdir / "sm80.toml", kernels=kdir)
    assert mine.root == kdir.resolve() and mine.family.source == "my_fa/flash_fwd.cu"


def test_a_name_defined_in_two_kernel_directories_is_refused(kdir, tmp_path):
    twin = tmp_path / "twin"
    shutil.copytree(kdir, twin)
    with pytest.raises(SpaceError, match="'my_fa' is defined twice"):
        load_space("my_fa", kernels=[kdir, twin])
    assert load_space(twin / "my_fa.toml", kernels=[kdir, twin]).root == twin.resolve()


@pytest.mark.parametrize("source", ["../my_fa/flash_fwd.cu", "my_fa/../my_fa/flash_fwd.cu", "/etc/passwd"])
def test_a_source_outside_the_directory_by_path_is_refused(kdir, source):
    _edit(kdir / "my_fa.toml", 'source = "my_fa/flash_fwd.cu"', f'source = "{source}"')
    with pytest.raises(SpaceError, match=r"\[family\] source .*must be a relative path inside"):
        load_space("my_fa", kernels=kdir)


def test_a_source_that_links_out_of_the_directory_is_refused(kdir, tmp_path):
    outside = tmp_path / "outside.cu"
    shutil.copy(kdir / "my_fa" / "flash_fwd.cu", outside)
    (kdir / "my_fa" / "linked.cu").symlink_to(outside)
    _edit(kdir / "my_fa.toml", 'source = "my_fa/flash_fwd.cu"', 'source = "my_fa/linked.cu"')
    with pytest.raises(SpaceError, match=r"is not a file under .*a link out of it does not count"):
        load_space("my_fa", kernels=kdir)


def test_an_include_that_links_out_is_not_read(kdir, tmp_path):
    """A macro read only by a header linked in from outside does not count as read by the kernel."""
    outside = tmp_path / "extra.cuh"
    outside.write_text("#define USES FT_EXTRA\n")
    (kdir / "my_fa" / "extra.cuh").symlink_to(outside)
    _edit(kdir / "my_fa" / "config.cuh", "namespace my_fa {", '#include "my_fa/extra.cuh"\nnamespace my_fa {')
    _edit(
        kdir / "my_fa.toml",
        "[derived.threads]",
        '[knobs.extra]\nmacro = "FT_EXTRA"\nvalues = [0, 1]\ndefault = 0\nhelp = "x"\n\n[derived.threads]',
    )
    with pytest.raises(SpaceError, match="macro FT_EXTRA is never read by the my_fa kernel"):
        load_space("my_fa", kernels=kdir)


def test_a_macro_the_kernel_never_reads_is_refused_naming_the_directory(kdir):
    header = kdir / "my_fa" / "config.cuh"
    header.write_text(header.read_text().replace("FT_THREADS_PER_ROW", "FT_ROW_THREADS"))
    with pytest.raises(SpaceError, match=r"FT_THREADS_PER_ROW is never read .*my_fa/flash_fwd.cu"):
        load_space("my_fa", kernels=kdir)


def test_an_oversized_source_is_refused(kdir):
    with (kdir / "my_fa" / "flash_fwd.cu").open("a") as f:
        f.write("// " + "x" * (1 << 20) + "\n")
    with pytest.raises(SpaceError, match="larger than 1048576 bytes"):
        load_space("my_fa", kernels=kdir)


def test_the_source_digest_covers_exactly_what_the_family_includes(kdir):
    before = load_space("my_fa", kernels=kdir).source_digest()
    (kdir / "my_fa" / "notes.cuh").write_text("// never included\n")
    assert load_space("my_fa", kernels=kdir).source_digest() == before
    with (kdir / "my_fa" / "config.cuh").open("a") as f:
        f.write("// an edit\n")
    edited = load_space("my_fa", kernels=kdir).source_digest()
    assert edited != before
    _edit(kdir / "my_fa" / "config.cuh", "// an edit\n", '#include "my_fa/notes.cuh"\n')
    included = load_space("my_fa", kernels=kdir).source_digest()
    (kdir / "my_fa" / "notes.cuh").write_text("// now included, and edited\n")
    assert len({before, edited, included, load_space("my_fa", kernels=kdir).source_digest()}) == 4


def test_the_package_families_keep_kernel_src_as_their_root():
    for name in available_families():
        space = load_space(name)
        assert space.root == KERNEL_SRC and space.origin == "package"
        assert len(space.source_digest()) == 16
