"""gnorm test helpers: ``gnorm_cases`` (inputs, the comparison against the reference) is
importable from this folder's tests."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
