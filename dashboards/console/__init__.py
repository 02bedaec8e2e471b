"""The Streamlit ops console (run with `tailguard console`)."""
