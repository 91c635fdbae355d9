"""Steps 1-3 of the flow: the notification intake, the sync task, staging and the store."""
