"""docs/reference/ is generated from each subcommand's --help: a changed option makes its page stale."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from make_reference import stale  # noqa: E402


def test_every_reference_page_matches_its_help():
    assert stale() == [], "run: python scripts/make_reference.py"


def _page_rows() -> dict[str, dict[str, str]]:
    """docs/reference/recipe-keys.md as {section title: {key: option cell}}."""
    rows: dict[str, dict[str, str]] = {}
    section = None
    for line in (ROOT / "docs" / "reference" / "recipe-keys.md").read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].split("`")[1] if "`" in line else "top level"
            rows[section] = {}
        elif section and line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[section][cells[0].strip("`")] = cells[-2]
    return rows


def test_every_key_of_every_builtin_recipe_is_on_the_recipe_keys_page():
    import tomllib

    rows = _page_rows()
    recipes = sorted((ROOT / "jepa_cli" / "recipes").glob("*.toml"))
    assert len(recipes) == 14
    for recipe in recipes:
        document = tomllib.loads(recipe.read_text())
        name = document["objective"]
        table = document.get(name, {})
        assert set(document) - {name} <= set(rows["top level"]), recipe.name
        documented = set(rows[f"[{name}]"]) | set(rows.get(f"[{name}.mask_options]", {}))
        assert set(table) - {"mask_options"} <= documented, recipe.name
        assert set(table.get("mask_options", {})) <= set(rows.get(f"[{name}.mask_options]", {})), recipe.name


def test_the_recipe_keys_page_names_only_options_that_jepa_train_takes():
    from click.testing import CliRunner

    from jepa_cli.cli.main import cli

    help_text = CliRunner().invoke(cli, ["train", "--help"], terminal_width=200).stdout
    rows = _page_rows()
    named = {cell.strip("`") for section in rows.values() for option in section.values()
             for cell in option.split(", ") if option != "recipe"}
    assert len(named) == 95  # the 36 trainer keys (38 names with -o and --out) and all 57 objective options
    assert {flag for flag in named if flag not in help_text} == set()


def test_a_key_whose_flag_reads_another_kind_is_marked_recipe_only():
    rows = _page_rows()
    assert rows["[ijepa.mask_options]"]["npred"] == "`--npred`"  # an int, as I-JEPA's npred
    assert rows["[vjepa.mask_options]"]["npred"] == "recipe"  # one int per mask pair: --npred reads one int
    assert rows["[vjepa]"]["num_frames"] == "recipe"
    assert rows["[flow]"]["cond_drop"] == "`--cond-drop`"
