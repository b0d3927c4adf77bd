"""The examples: each a script (``python examples/wordcount.py``) holding its pipeline and
its reference computation; what they share is ``examples.scaffold``."""
