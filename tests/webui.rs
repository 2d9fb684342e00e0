//! The chat page at `/`, in a real headless browser (Debian's Chromium, driven over the
//! DevTools protocol): load it, type a message, watch the reply stream in, reload and find the
//! conversation kept; `--no-webui` turns the page off.
//!
//! The browser is `$MINFER_CHROMIUM` or `chromium` on the PATH (`scripts/install-chromium.sh`
//! installs it; the test script runs that first). `MINFER_WEBUI_MODEL` serves another model and
//! `MINFER_WEBUI_SCREENSHOT=FILE` saves a PNG of the page with its reply (the picture in docs/server.md).

mod common;

use common::browser::Browser;
use common::server::Server;
use serde_json::json;

/// The messages on the page: (class, text) each.
const MESSAGES: &str =
    "JSON.stringify([...document.querySelectorAll('#messages .msg')].map(e => [e.className, e.textContent]))";

#[test]
fn the_chat_page_streams_a_typed_message_s_reply_and_keeps_the_conversation_over_a_reload() {
    let model = std::env::var("MINFER_WEBUI_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| common::tiny_model("qwen2", "Q8_0"));
    let server = Server::start(&model, &["--n-slots", "1"], &[]);
    let mut browser = Browser::launch();
    browser.open(&server.url("/"), "!!document.getElementById('messages')");
    assert_eq!(browser.eval("document.title"), "minfer");
    // Settings first: short, greedy replies.
    browser.eval(
        "(() => { for (const [id, v] of [['max_tokens', '48'], ['temperature', '0'], ['system', 'Be brief.']]) { \
           const e = document.getElementById(id); e.value = v; e.dispatchEvent(new Event('change')); } })()",
    );
    // Type the message and press Enter, as a person would.
    browser.eval("document.getElementById('input').focus()");
    browser.call("Input.insertText", json!({"text": "Write a haiku about the sea."}));
    for kind in ["keyDown", "keyUp"] {
        browser.call(
            "Input.dispatchKeyEvent",
            json!({"type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "text": "\r"}),
        );
    }
    browser.wait_for(
        "document.getElementById('messages').dataset.state === 'idle' && \
         document.querySelectorAll('#messages .msg').length === 2",
        "the reply to finish",
    );
    let messages: Vec<(String, String)> = serde_json::from_str(browser.eval(MESSAGES).as_str().unwrap()).unwrap();
    assert_eq!(
        messages[0],
        ("msg user".to_string(), "Write a haiku about the sea.".to_string())
    );
    assert_eq!(messages[1].0, "msg assistant", "{messages:?}");
    assert!(!messages[1].1.is_empty(), "an empty reply");
    // It arrived as a stream: the reply was drawn once per content delta, more than once.
    let chunks: u64 = browser
        .eval("document.querySelector('#messages .msg.assistant').dataset.chunks")
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(chunks >= 2, "the reply came in {chunks} piece(s)");
    // The server saw the page's settings: the reply is the API's greedy reply to the same turn.
    let (status, api) = server.json(
        "/v1/chat/completions",
        json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write a haiku about the sea."}],
               "max_tokens": 48, "temperature": 0, "top_p": 0.95, "top_k": 40}),
    );
    assert_eq!(status, 200);
    let rendered = browser.eval("document.querySelector('#messages .msg.assistant').innerText");
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    assert_eq!(
        words(rendered.as_str().unwrap()),
        words(api["choices"][0]["message"]["content"].as_str().unwrap())
            .replace("**", "")
            .replace('`', ""),
        "the page shows the API's reply"
    );
    if let Ok(path) = std::env::var("MINFER_WEBUI_SCREENSHOT") {
        std::fs::write(path, browser.screenshot()).unwrap();
    }
    // A reload keeps the conversation (the browser's storage).
    browser.call("Page.reload", json!({}));
    browser.wait_for(
        "document.readyState === 'complete' && document.querySelectorAll('#messages .msg').length === 2",
        "the conversation after the reload",
    );
    let kept: Vec<(String, String)> = serde_json::from_str(browser.eval(MESSAGES).as_str().unwrap()).unwrap();
    assert_eq!(kept, messages);
    assert_eq!(browser.eval("document.getElementById('max_tokens').value"), "48");
    // New chat empties it.
    browser.eval("document.getElementById('new-chat').click()");
    assert_eq!(browser.eval("document.querySelectorAll('#messages .msg').length"), 0);
}

#[test]
fn no_webui_turns_the_page_off_and_the_page_needs_no_api_key() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let off = Server::start(&model, &["--n-slots", "1", "--no-webui"], &[]);
    let (status, _) = off.request("GET", "/", "", b"");
    assert_eq!(status, 404);
    let keyed = Server::start(&model, &["--n-slots", "1", "--api-key", "k"], &[]);
    let (status, page) = keyed.request("GET", "/", "", b"");
    assert_eq!(status, 200);
    assert!(page.contains("<title>minfer</title>"));
    // Everything the page calls still needs the key.
    let (status, _) = keyed.request("GET", "/v1/models", "", b"");
    assert_eq!(status, 401);
}
