import pathlib
import sys

# examples/ is not installed: its packages are imported from the checkout
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
