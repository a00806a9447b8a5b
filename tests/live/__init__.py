"""Live SGLang engines and HTTP servers on the CPU (marker ``live_sglang``)."""
