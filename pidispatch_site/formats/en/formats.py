"""Times in the admin with seconds (the operator compares them with log lines)."""

# Times as an operator compares them with log lines: seconds and the zone, everywhere the admin shows one.
DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
