"""Sphinx configuration: the API reference from the docstrings, with the markdown guide and
internals pages included as they are.

Build (warnings are errors, as in ``tests/test_docs.py``)::

    pip install -e ".[docs]"
    sphinx-build -W --keep-going -b html docs docs/_build/html
"""

import importlib.util
import os
import sys

# document the source tree next to this file, not whatever copy of the package is installed
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src")))

project = "torch-semimarkov"
author = "torch-semimarkov contributors"
copyright = "torch-semimarkov contributors"

import torch_semimarkov  # noqa: E402

release = torch_semimarkov.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# Google-style docstrings ("Args:", "Returns:", "Example:")
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# "Attributes:" as a field list of the class, so that they are not described twice when autodoc
# also documents the same attributes (slots, properties)
napoleon_use_ivar = False

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": False}
# optional dependencies that are missing here are mocked, so that the reference builds without
# them and still documents SemiCRFLightningModule as it is (not lightning.py's placeholder);
# numba and Triton are imported lazily by the modules documented here
autodoc_mock_imports = [name for name in ("lightning", "pytorch_lightning", "Bio")
                        if importlib.util.find_spec(name) is None]

myst_heading_anchors = 3

html_theme = "alabaster"
html_title = f"torch-semimarkov {release}"
