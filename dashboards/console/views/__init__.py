"""The console's pages, one script each, run by Streamlit's navigation (app.py)."""
