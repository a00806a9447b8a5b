"""The SGLang plugin's objects against SGLang's real code, without a live engine."""
