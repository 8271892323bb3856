"""The pytest suite of the Python module (ctest -L python). Examples in examples/python/ are imported from there."""

import os
import sys
from pathlib import Path

SOURCE_DIR = Path(os.environ.get("TAPEGRAD_SOURCE_DIR", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(SOURCE_DIR / "examples" / "python"))
