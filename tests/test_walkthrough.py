"""docs/walkthrough.ipynb, the teaching notebook, executed cell by cell on the tiny test model (nbclient): every
cell runs, and the tables of each equation's step come out."""
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def test_the_walkthrough_runs_on_the_tiny_model(monkeypatch):
    monkeypatch.setenv("WALKTHROUGH_MODEL", "tiny")
    nb = nbformat.read(ROOT / "docs" / "walkthrough.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    text = "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                     for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs)
    for shown in ("Eq. 1 reward", "Eq. 2 advantage", "Eq. 3 reward", "Eq. 4 trigger", "π before", "π after",
                  "thm1_mu", "P's training samples this iteration", "R's training samples this iteration"):
        assert shown in text, shown
