//! A thinking model's reasoning in generated text (`<think>…</think>` of Qwen3, QwQ and the
//! DeepSeek-R1 distills): the reply split into reasoning and content, whole and incrementally
//! for a stream, as llama.cpp's `deepseek` reasoning format splits it. gpt-oss's channels are
//! [`super::harmony`]'s; this file knows only tag pairs.
//!
//! The reasoning is the text between the opening tag — at the start of the reply, after
//! whitespace, or already at the end of the prompt when the template opened it (the R1
//! distills' generation prompt ends with `<think>\n`) — and the closing tag, whitespace trimmed
//! at both ends; the content is what follows the closing tag, its leading whitespace dropped.
//! A reply that does not open with the tag is all content, as written. A reply cut short inside
//! its reasoning (a token limit) has that reasoning and no content. A stream and the whole
//! reply give the same fields, whatever the pieces.
//!
//! The decision that a model thinks, and in which tags, is [`ThinkTags::of_template`]'s, from
//! the chat template's source; rendering is the model's own template's.

/// Where a reply's reasoning goes (llama.cpp's `--reasoning-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// Left in the content, as generated.
    None,
    /// Split out (`reasoning_content`), the content without it.
    Deepseek,
    /// Split out, and kept in the content with its tags too.
    DeepseekLegacy,
    /// Split out where the chat template thinks (the default).
    #[default]
    Auto,
}

impl ReasoningFormat {
    /// The format named as llama.cpp names it (`none`, `deepseek`, `deepseek-legacy`, `auto`).
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "none" => ReasoningFormat::None,
            "deepseek" => ReasoningFormat::Deepseek,
            "deepseek-legacy" => ReasoningFormat::DeepseekLegacy,
            "auto" => ReasoningFormat::Auto,
            _ => return None,
        })
    }

    /// llama.cpp's name of the format.
    pub fn name(self) -> &'static str {
        match self {
            ReasoningFormat::None => "none",
            ReasoningFormat::Deepseek => "deepseek",
            ReasoningFormat::DeepseekLegacy => "deepseek-legacy",
            ReasoningFormat::Auto => "auto",
        }
    }
}

/// A reasoning tag pair a template writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkTags {
    /// The opening tag (`<think>`).
    pub open: &'static str,
    /// The closing tag (`</think>`).
    pub close: &'static str,
}

/// The pairs known, in the order they are looked for in a template.
const KNOWN: [ThinkTags; 3] = [
    ThinkTags {
        open: "<think>",
        close: "</think>",
    },
    ThinkTags {
        open: "<seed:think>",
        close: "</seed:think>",
    },
    ThinkTags {
        open: "[THINK]",
        close: "[/THINK]",
    },
];

impl ThinkTags {
    /// The tags a chat template thinks in: the first known pair both of whose tags its source
    /// writes; `None` for a template that does not think.
    pub fn of_template(source: &str) -> Option<ThinkTags> {
        KNOWN
            .iter()
            .find(|t| source.contains(t.open) && source.contains(t.close))
            .copied()
    }

    /// Whether a rendered prompt leaves the reasoning open: its last non-blank text is the
    /// opening tag, so the reply starts inside the reasoning.
    pub fn opened_by(&self, prompt: &str) -> bool {
        prompt.trim_end().ends_with(self.open)
    }
}

/// A whole reply, split.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThinkReply {
    /// The reasoning, `None` when the reply has none (it did not open the tag).
    pub reasoning: Option<String>,
    /// The rest.
    pub content: String,
}

/// One part of a streamed reply, as it becomes known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThinkDelta {
    /// More reasoning text.
    Reasoning(String),
    /// More content text.
    Content(String),
}

/// `text` (a reply; `opened` when the prompt left the reasoning open) split.
pub fn parse(text: &str, tags: ThinkTags, opened: bool) -> ThinkReply {
    let mut stream = ThinkStream::new(tags, opened);
    let mut deltas = stream.push(text);
    deltas.extend(stream.finish());
    let mut reply = ThinkReply::default();
    for delta in deltas {
        match delta {
            ThinkDelta::Reasoning(t) => reply.reasoning.get_or_insert_with(String::new).push_str(&t),
            ThinkDelta::Content(t) => reply.content.push_str(&t),
        }
    }
    if stream.saw_reasoning && reply.reasoning.is_none() {
        reply.reasoning = Some(String::new());
    }
    reply
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the reply's first non-blank text: it may still open the tag.
    Start,
    /// Inside the reasoning, no text of it sent yet (its leading whitespace is dropped).
    ReasoningStart,
    /// Inside the reasoning.
    Reasoning,
    /// Just past the closing tag: leading whitespace of the content is dropped.
    ContentStart,
    /// Content, to the end.
    Content,
}

/// The split of a reply arriving in pieces: [`ThinkStream::push`] each piece, then
/// [`ThinkStream::finish`]. Text that may be the start of a tag, and whitespace that may turn
/// out to end the reasoning, is held back until the next piece says what it is.
#[derive(Debug, Clone)]
pub struct ThinkStream {
    tags: ThinkTags,
    state: State,
    /// Text received but not yet sent.
    held: String,
    /// Whether the reply had a reasoning section (for a whole reply's empty reasoning).
    saw_reasoning: bool,
}

impl ThinkStream {
    /// A stream for a reply in `tags`, starting inside the reasoning when `opened`.
    pub fn new(tags: ThinkTags, opened: bool) -> Self {
        ThinkStream {
            tags,
            state: if opened { State::ReasoningStart } else { State::Start },
            held: String::new(),
            saw_reasoning: opened,
        }
    }

    /// The parts `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<ThinkDelta> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let rest = self.held.trim_start();
                    if rest.starts_with(self.tags.open) {
                        let at = self.held.len() - rest.len() + self.tags.open.len();
                        self.held.drain(..at);
                        self.state = State::ReasoningStart;
                        self.saw_reasoning = true;
                    } else if self.tags.open.starts_with(rest) {
                        // Blank so far, or a prefix of the tag: wait for more.
                        return out;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::ReasoningStart => {
                    if !self.skip_blanks(State::Reasoning) {
                        return out;
                    }
                }
                State::Reasoning => match self.held.find(self.tags.close) {
                    Some(at) => {
                        let reasoning = self.held[..at].trim_end().to_string();
                        if !reasoning.is_empty() {
                            out.push(ThinkDelta::Reasoning(reasoning));
                        }
                        self.held.drain(..at + self.tags.close.len());
                        self.state = State::ContentStart;
                    }
                    None => {
                        // Keep back a possible start of the closing tag and trailing blanks.
                        let keep = partial_suffix(&self.held, self.tags.close);
                        let body = &self.held[..self.held.len() - keep];
                        let send = body.trim_end().len();
                        if send > 0 {
                            out.push(ThinkDelta::Reasoning(self.held[..send].to_string()));
                            self.held.drain(..send);
                        }
                        return out;
                    }
                },
                State::ContentStart => {
                    if !self.skip_blanks(State::Content) {
                        return out;
                    }
                }
                State::Content => {
                    if !self.held.is_empty() {
                        out.push(ThinkDelta::Content(std::mem::take(&mut self.held)));
                    }
                    return out;
                }
            }
        }
    }

    /// Drops the blanks the held text starts with and, once text follows them, moves to `next`;
    /// whether it did (otherwise the next piece must say more).
    fn skip_blanks(&mut self, next: State) -> bool {
        let blanks = self.held.len() - self.held.trim_start().len();
        self.held.drain(..blanks);
        if self.held.is_empty() {
            return false;
        }
        self.state = next;
        true
    }

    /// The parts held back at the end of the reply.
    pub fn finish(&mut self) -> Vec<ThinkDelta> {
        let held = std::mem::take(&mut self.held);
        match self.state {
            // Blank, or an unfinished tag: that is content, as written.
            State::Start | State::Content if !held.is_empty() => vec![ThinkDelta::Content(held)],
            // Cut short inside the reasoning: what it holds, trailing blanks dropped.
            State::Reasoning if !held.trim_end().is_empty() => {
                vec![ThinkDelta::Reasoning(held.trim_end().to_string())]
            }
            _ => Vec::new(),
        }
    }
}

/// The length of the longest end of `text` that is a proper start of `tag`.
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAGS: ThinkTags = KNOWN[0];

    fn whole(text: &str, opened: bool) -> (Option<String>, String) {
        let r = parse(text, TAGS, opened);
        (r.reasoning, r.content)
    }

    fn split(reasoning: Option<&str>, content: &str) -> (Option<String>, String) {
        (reasoning.map(str::to_string), content.to_string())
    }

    #[test]
    fn a_reply_opening_the_tag_is_split_with_its_blanks_trimmed() {
        assert_eq!(
            whole("<think>\nLet me see.\n</think>\n\nIt is 4.", false),
            split(Some("Let me see."), "It is 4.")
        );
        assert_eq!(whole("  <think>a</think>b", false), split(Some("a"), "b"));
        assert_eq!(whole("<think>\n\n</think>\n\nHi", false), split(Some(""), "Hi"));
    }

    #[test]
    fn a_reply_without_the_tag_is_content_as_written() {
        assert_eq!(
            whole("  Hello <think>x</think>", false),
            split(None, "  Hello <think>x</think>")
        );
        assert_eq!(whole("<thin", false), split(None, "<thin"));
        assert_eq!(whole("", false), split(None, ""));
    }

    #[test]
    fn a_prompt_that_opened_the_reasoning_makes_the_reply_start_inside_it() {
        assert_eq!(whole("Hmm.\n</think>\nYes.", true), split(Some("Hmm."), "Yes."));
        assert!(TAGS.opened_by("<|Assistant|><think>\n"));
        assert!(!TAGS.opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    }

    #[test]
    fn a_reply_cut_short_in_its_reasoning_has_that_reasoning_and_no_content() {
        assert_eq!(
            whole("<think>I am still thinking  ", false),
            split(Some("I am still thinking"), "")
        );
        assert_eq!(whole("<think>x</thi", false), split(Some("x</thi"), ""));
    }

    #[test]
    fn every_way_of_cutting_a_reply_into_pieces_gives_the_whole_replys_split() {
        for (text, opened) in [
            ("<think>\nLet me see. 2 + 2 </think> \n\nIt is 4.\n", false),
            ("\n<think>a < b </ think></think>x</think>y", false),
            ("Plain text, no reasoning.", false),
            ("Hmm.\n</think>\nYes.", true),
            ("<think>cut  ", false),
            ("  <thi", false),
            ("<think>é ü</think>ß", false),
        ] {
            let expected = parse(text, TAGS, opened);
            let bounds: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
            for &i in &bounds {
                for &j in bounds.iter().filter(|&&j| j >= i) {
                    let mut stream = ThinkStream::new(TAGS, opened);
                    let mut deltas = stream.push(&text[..i]);
                    deltas.extend(stream.push(&text[i..j]));
                    deltas.extend(stream.push(&text[j..]));
                    deltas.extend(stream.finish());
                    let (mut reasoning, mut content) = (None::<String>, String::new());
                    for d in deltas {
                        match d {
                            ThinkDelta::Reasoning(t) => reasoning.get_or_insert_with(String::new).push_str(&t),
                            ThinkDelta::Content(t) => content.push_str(&t),
                        }
                    }
                    let reasoning = reasoning.or(stream.saw_reasoning.then(String::new));
                    assert_eq!(
                        (reasoning.as_deref(), content.as_str()),
                        (expected.reasoning.as_deref(), expected.content.as_str()),
                        "{text:?} cut at {i} and {j}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_tags_are_found_in_the_template() {
        assert_eq!(ThinkTags::of_template("{{ '<think>\\n' }}…</think>"), Some(TAGS));
        assert_eq!(ThinkTags::of_template("{{ messages }}"), None);
        assert_eq!(
            ThinkTags::of_template("[THINK]x[/THINK]").map(|t| t.open),
            Some("[THINK]")
        );
    }
}
