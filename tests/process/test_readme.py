"""The README a newcomer reads first: short, opening with the two commands that work, its links and commits real."""

from __future__ import annotations

import re
import shutil
import subprocess
import pytest

from helpers import REPO

README = (REPO / "README.md").read_text()


def _first_code_block() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert block, "the README opens with no bash block"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_the_readme_reads_in_ten_minutes():
    assert len(README.splitlines()) <= 350


def test_the_readme_opens_with_the_setup_and_run_command_and_the_test_command():
    run, test = _first_code_block()
    assert run.startswith("python3 -m venv .venv && ") and run.endswith("&& posexp train")
    assert test.endswith("&& pytest")


def test_the_readme_test_command_is_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert _first_code_block()[1] == ci


def test_the_readme_links_to_files_that_exist():
    targets = re.findall(r"\]\(((?!https?:|#)[^)]+)\)", README)
    assert targets, "the README links to no file"
    assert not [t for t in targets if not (REPO / t).exists()]


def test_the_readme_anchors_name_its_sections():
    slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", README, re.M)}
    assert not [a for a in re.findall(r"\]\(#([^)]+)\)", README) if a not in slugs]


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout")
def test_the_commits_the_measured_tables_name_exist():
    commits = set(re.findall(r"commit `([0-9a-f]{7,40})`", README))
    for study in (REPO / "scripts").glob("study_*.md"):
        commits |= set(re.findall(r"`([0-9a-f]{7,40})`", study.read_text().split("\n\n## ")[0]))
    assert len(commits) >= 2
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True,
                             text=True).stdout.strip() == "true"
    if shallow:
        pytest.skip("a shallow clone holds only recent commits")
    missing = [c for c in sorted(commits) if subprocess.run(["git", "cat-file", "-e", f"{c}^{{commit}}"], cwd=REPO,
                                                            capture_output=True).returncode != 0]
    assert not missing


def test_every_code_block_of_the_readme_is_closed():
    assert sum(1 for line in README.splitlines() if line.startswith("```")) % 2 == 0
