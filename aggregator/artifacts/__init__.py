"""Finished files of watched directories shipped into the lake with an index event
(`[[files]]`, docs/configuration.md; the layout in docs/parquet-layout.md)."""
