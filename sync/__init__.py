"""scrapesync: keeps a database in step with Web Scraper Cloud."""
