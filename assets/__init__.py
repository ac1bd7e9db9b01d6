"""Files that ship with eaglewatch: Textual styles and the bundled sample data."""
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
SAMPLE_CHAT_DATA = ASSETS_DIR / "data" / "sample_chat.jsonl"
