"""One module per endpoint family; `common` holds what every POST surface shares."""
