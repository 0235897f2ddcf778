"""delta test helpers: ``chunk_masks`` (which entries of a chunk's [BT, BT] score matrix lie above
its diagonal) is importable from this folder's tests."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
