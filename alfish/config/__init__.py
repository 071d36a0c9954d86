"""Configuration: the validated TrainerConfig, loading gin confs with strict errors, and the config record's texts."""
from alfish.config.conf_error import ConfError
from alfish.config.config_record import ConfigRecord, config_record
from alfish.config.loading import load_conf
from alfish.config.trainer_config import TrainerConfig
from alfish.config.untrusted import load_config_text

__all__ = ['TrainerConfig', 'ConfError', 'load_conf', 'load_config_text', 'ConfigRecord',
           'config_record']
