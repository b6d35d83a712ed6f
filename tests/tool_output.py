"""What a tool wrote on stderr itself: the tests that check its one-line errors
read this.

Some releases print warnings of their own whenever a program imports or loads
with them, whatever the program does: torch 2.4 and 2.5 warn that TorchScript
functional optimizers are deprecated (mmengine imports them) and that
``torch.load`` defaults to ``weights_only=False`` (mmengine's checkpoint
loads). No filter silences the first (torch warns under
``simplefilter('always')``).
"""
import re

#: one ``warnings`` record from an installed package:
#: ``<file>:<line>: <Category>: <message>``, then the indented source line
#: where Python found it
_PACKAGE_WARNING = re.compile(
    r'^\S*/site-packages/\S+:\d+: \w*Warning: .*\n(?:[ \t]+.*\n)?',
    re.MULTILINE)


def own_stderr(stderr: str) -> str:
    """``stderr`` without the warnings installed packages printed."""
    return _PACKAGE_WARNING.sub('', stderr)
