"""kda test helpers: ``fla_standins`` (fla's stage functions in plain torch, for the CPU chain
test) is importable from this folder's tests."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
