"""The errors our checks raise; tools print each as one ``aa_det: ...`` line.

:class:`ConfigError` is an input that cannot work (a config, a file it
points at), refused before the work it would spoil; :class:`RunError` is a
run that went wrong while it ran (a non-finite loss or output).
"""
import re
from typing import Optional

#: the converter of checkpoints that torch's safe loading refuses
CONVERTER = 'python tools/convert_checkpoint.py OLD NEW'


class ConfigError(ValueError):
    """A config or a file it points at is unusable; the message names it."""


class RunError(RuntimeError):
    """A run stopped on what it computed; the message says where."""


def refused_global(error: BaseException) -> Optional[str]:
    """The global that torch's safe loading refused in ``error``
    (``'GLOBAL mmengine.logging.history_buffer.HistoryBuffer'``), or None
    for any other error."""
    match = re.search(r'Unsupported global: (GLOBAL \S+)', str(error))
    return match.group(1) if match else None


def unsafe_checkpoint_error(path: str, global_: str) -> ConfigError:
    """The one line for a checkpoint ``path`` that holds ``global_``, an
    object torch's safe loading refuses: mmengine's Runner writes its
    ``HistoryBuffer`` (numpy) unless ``SafeCheckpointHook`` runs, which the
    converter rewrites; another object needs the user's own loading."""
    runner_types = re.match(r'GLOBAL (mmengine|numpy|builtins\.getattr)',
                            global_)
    fix = (f'convert it: {CONVERTER}'
           if runner_types else 'load it once and save only its state_dict')
    return ConfigError(
        f'checkpoint file cannot be loaded: {path}: it holds Python objects '
        f'that safe loading refuses ({global_}); if you trust the file, '
        f'{fix}')
