"""One module per tab: its layout, its events, and the plain functions behind them."""
