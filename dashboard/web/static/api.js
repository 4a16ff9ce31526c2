// The JSON API: every call either returns the parsed body or throws an Error whose
// message is the server's own {"error": ...} text.

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

export async function getJSON(path, params = {}) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== null && v !== undefined && v !== "") query.set(k, v);
  }
  const url = query.toString() ? `${path}?${query}` : path;
  let response;
  try {
    response = await fetch(url, { headers: { Accept: "application/json" } });
  } catch (err) {
    throw new ApiError(`the dashboard server is not answering (${err.message})`, 0);
  }
  let body = null;
  try {
    body = await response.json();
  } catch (err) {
    throw new ApiError(`bad answer from ${path} (HTTP ${response.status})`, response.status);
  }
  if (!response.ok) throw new ApiError(body.error || `HTTP ${response.status}`, response.status);
  return body;
}
