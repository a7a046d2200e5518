// Every moment a page shows (<time data-format>, written by the `when` filter in the server's zone, named) is
// shown in the viewer's own time zone, named too ("Dec 4, 03:31 CET"); the server's reading stays in its
// title. Without JavaScript the server's reading, with its zone, is what shows.
const parts = (format) => ({
  ...(format.includes("M") ? { month: "short", day: "numeric" } : {}),
  ...(format.includes("Y") ? { year: "numeric" } : {}),
  ...(format.includes("H") ? { hour: "2-digit", minute: "2-digit", hourCycle: "h23" } : {}),
  ...(format.includes("s") ? { second: "2-digit" } : {}),
  timeZoneName: "short",
});

function localise(root) {
  for (const time of root.querySelectorAll("time[data-format]:not([data-local])")) {
    const moment = new Date(time.getAttribute("datetime"));
    if (Number.isNaN(moment.getTime())) continue;
    time.title = time.textContent;
    time.textContent = new Intl.DateTimeFormat(undefined, parts(time.dataset.format)).format(moment);
    time.dataset.local = "";
  }
}

// The server reads and writes times in the zone the `zone` cookie names (journal/zones.py): told here, so
// that from the next page on, what pages show and what forms take are in the viewer's zone. A page drawn
// before that (the login page, on a first visit) names the zone its forms read.
const browserZone = Intl.DateTimeFormat().resolvedOptions().timeZone;
if (browserZone && document.documentElement.dataset.zone !== browserZone) {
  const secure = location.protocol === "https:" ? "; secure" : "";
  document.cookie = `zone=${encodeURIComponent(browserZone)}; path=/; max-age=31536000; samesite=lax${secure}`;
}

localise(document);
document.addEventListener("htmx:afterSettle", (event) => localise(event.target));
