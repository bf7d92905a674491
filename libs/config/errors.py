"""The one exception type for configuration problems found at a process's edge."""


class ConfigError(ValueError):
    """A flag or config value is invalid. The message names the flag and what was expected."""

    def __init__(self, flag: str, value: object, expected: str) -> None:
        self.flag = flag
        self.value = value
        self.expected = expected
        super().__init__(f"{flag}: got {value!r}; expected {expected}")
