"""What a campaign shows: the live progress display, the terminal summary and the HTML report.
"""
