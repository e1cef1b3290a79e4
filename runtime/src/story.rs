//! A tool's idempotency story, and the hints for clients it implies.
//!
//! Vocabulary only: every layer above (texts, definitions, the executor, the exports) reads it.

/// How a tool behaves when it is called again: every tool states exactly one story.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Story {
    /// Changes nothing; runs every time.
    ReadOnly,
    /// Changes something; a key names the action, and the runtime enforces it.
    Idempotent,
    /// Repeating has no extra effect (set X to Y, delete if present); runs every time.
    Natural,
    /// Has effects and no key: needs approval, and a timeout is not retryable.
    Unkeyed,
}

impl Story {
    /// The story as written in the attribute.
    pub fn as_str(self) -> &'static str {
        match self {
            Story::ReadOnly => "read_only",
            Story::Idempotent => "idempotent",
            Story::Natural => "natural",
            Story::Unkeyed => "unkeyed",
        }
    }
}

/// Hints for clients, as MCP names them, derived from the story.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Annotations {
    /// The tool changes nothing.
    pub read_only: bool,
    /// The tool may destroy or overwrite something.
    pub destructive: bool,
    /// Calling again with the same arguments has no further effect.
    pub idempotent: bool,
    /// The tool talks to systems outside the agent.
    pub open_world: bool,
}

impl Annotations {
    /// The annotations a story implies. An `idempotent` tool counts as destructive unless it
    /// says otherwise with [`not_destructive`](Self::not_destructive).
    pub const fn for_story(story: Story) -> Annotations {
        let destructive = true;
        match story {
            Story::ReadOnly => Annotations {
                read_only: true,
                destructive: false,
                idempotent: true,
                open_world: true,
            },
            Story::Idempotent => Annotations {
                read_only: false,
                destructive,
                idempotent: true,
                open_world: true,
            },
            Story::Natural => Annotations {
                read_only: false,
                destructive: false,
                idempotent: true,
                open_world: true,
            },
            Story::Unkeyed => Annotations {
                read_only: false,
                destructive: true,
                idempotent: false,
                open_world: true,
            },
        }
    }
}

impl Annotations {
    /// The same annotations, saying the tool destroys and overwrites nothing
    /// (`idempotent(destructive = false)`).
    pub const fn not_destructive(mut self) -> Annotations {
        self.destructive = false;
        self
    }
}
