"""xarray integration: the backend entrypoint and the Dataset writer."""
