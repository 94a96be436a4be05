"""tools/findings_page.py: docs/findings.md is its template filled from the committed archives."""
import pytest

from tools import findings_page


def test_the_committed_page_is_the_archives_page(capsys):
    # every number of docs/findings.md that the template takes from the archives (tables, power, counts) is theirs:
    # a page edited by hand, or archives changed without the page, fails here with the first line that differs
    findings_page.main(["--check"])
    assert "the archives' page" in capsys.readouterr().out


def test_fill_counts_the_intervals_read_by_hand():
    # the tables' rows: 3 read (vals' _tables), 1 of them excluding 0; the prose adds [+0.010, +0.020] (excludes 0)
    # and [-0.010, +0.005] (does not), and the repeat of a table's [-0.300, -0.100] is not counted again:
    # 3 + 2 = 5 intervals, 1 + 1 = 2 exclude 0, round(5 x 0.05) = 0 by chance
    template = ("A {{a}}: [+0.010, +0.020] and [-0.010, +0.005], the table's [-0.300, -0.100] again.\n\n"
                "| row | [-0.300, -0.100] |\n\n{{intervals}} read, {{exclude}} exclude 0, {{chance}} by chance.")
    out = findings_page.fill(template, {"a": "b", "_tables": 3, "_excluding": 1})
    assert out.splitlines()[-1] == "5 read, 2 exclude 0, 0 by chance."
    assert out.startswith("A b: [+0.010, +0.020]")


def test_a_place_without_a_value_or_a_value_without_a_place_is_named():
    with pytest.raises(ValueError, match=r"\{\{power\}\} has no value"):
        findings_page.fill("{{power}}", {})
    with pytest.raises(ValueError, match="no place takes the value 'table:tiny'"):
        findings_page.fill("text", {"table:tiny": "| x |"})
    # a row's cell of a method no archive holds
    with pytest.raises(ValueError, match=r"\{\{step:tiny:nosuch\}\} has no value"):
        findings_page.fill("{{step:tiny:nosuch}}", {"_runs": {"tiny": {"grpo": {}}}})


def test_wrap_fills_paragraphs_and_items_and_leaves_tables_and_code():
    text = "\n".join(["> Intro words here.", "> - one two three four", ">   five six", "",
                      "| a | b c d e f g |", "", "    code  stays   as is", "", "[q]: some/where"])
    out = findings_page.wrap(text, width=14).splitlines()
    # the quote's paragraph, then its item at "> - " and its continuation at ">   " (14 columns at most)
    assert out[:5] == ["> Intro words", "> here.", "> - one two", ">   three four", ">   five six"]
    assert out[5:] == ["", "| a | b c d e f g |", "", "    code  stays   as is", "", "[q]: some/where"]
    # a line never begins with a list marker taken from the text: "- b" stays after "aaaa" (a line of 8 columns)
    assert findings_page.wrap("aaaa bb - b", width=8).splitlines() == ["aaaa", "bb - b"]
    assert findings_page.wrap("aaaa - bbbb", width=6).splitlines() == ["aaaa -", "bbbb"]


def test_check_names_the_first_line_that_differs_even_at_the_end(tmp_path, monkeypatch):
    # the archives' page "a\nb\n" against a page with one blank line more: line 3 differs (no line of the shorter)
    monkeypatch.setattr(findings_page, "page", lambda tmp: ("a\nb\n", {}))
    monkeypatch.setattr(findings_page, "PAGE", str(tmp_path / "findings.md"))
    (tmp_path / "findings.md").write_text("a\nb\n\n")
    with pytest.raises(SystemExit, match="findings.md: line 3 is not the archives' page"):
        findings_page.main(["--check"])
    (tmp_path / "findings.md").write_text("a\nb\n")
    findings_page.main(["--check"])
